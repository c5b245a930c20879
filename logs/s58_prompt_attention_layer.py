"""The prompt-attention kernel alone against a float64 softmax and torch's SDPA, then per-layer times at 769 / 2,629 / 6,000 tokens (9 heads over 3, D 64; stop 58). Usage: python logs/s58_prompt_attention_layer.py"""
import time, torch, torch.nn.functional as F
torch.set_num_threads(2)
from drafttree.kernels import gemm
ext = gemm.small_gemm()
g = torch.Generator().manual_seed(0)
def ref(q, k, v, scale):  # q [T,H,D], k [Hkv,T,D]
    T, H, D = q.shape; G = H // k.shape[0]
    kk = k.double().repeat_interleave(G, 0); vv = v.double().repeat_interleave(G, 0)
    s = torch.einsum("thd,hsd->hts", q.double(), kk) * scale
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("hts,hsd->thd", s.softmax(-1), vv)
for T in (1, 5, 16, 17, 63, 64, 65, 130, 300):
    q = torch.randn(T, 9, 64, generator=g).bfloat16(); k = torch.randn(3, T, 64, generator=g).bfloat16() * 2; v = torch.randn(3, T, 64, generator=g).bfloat16()
    out = ext.prompt_attention(q, k, v, 0.125)
    r = ref(q, k, v, 0.125)
    sd = F.scaled_dot_product_attention(q.transpose(0,1)[None], k[None], v[None], is_causal=True, scale=0.125, enable_gqa=True)[0].transpose(0,1)
    print(T, "kernel err", (out.double() - r).abs().max().item(), "sdpa err", (sd.double() - r).abs().max().item())
# strided k/v (cache view)
buf = torch.randn(3, 500, 64, generator=g).bfloat16(); vb = torch.randn(3, 500, 64, generator=g).bfloat16()
q = torch.randn(200, 9, 64, generator=g).bfloat16()
out = ext.prompt_attention(q, buf[:, :200], vb[:, :200], 0.125)
print("strided err", (out.double() - ref(q, buf[:, :200], vb[:, :200], 0.125)).abs().max().item())
for T in (769, 2629, 6000):
    q = torch.randn(T, 9, 64, generator=g).bfloat16(); k = torch.randn(3, T, 64, generator=g).bfloat16(); v = torch.randn(3, T, 64, generator=g).bfloat16()
    qs, ks, vs = q.transpose(0,1)[None].contiguous(), k[None], v[None]
    def a(): return ext.prompt_attention(q, k, v, 0.125)
    def b(): return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=0.125, enable_gqa=True)
    for f in (a, b): f()
    ta = min((lambda: (time.perf_counter(), a(), time.perf_counter()))()[::2] for _ in range(3))
    ta = min(-(lambda t0: t0 - (a(), time.perf_counter())[1])(time.perf_counter()) for _ in range(3))
    tb = min(-(lambda t0: t0 - (b(), time.perf_counter())[1])(time.perf_counter()) for _ in range(3))
    fl = 2 * T * T * 64 * 9
    print(f"T={T}: kernel {ta*1e3:.1f} ms ({fl/ta/1e9:.0f} GFLOP/s), sdpa {tb*1e3:.1f} ms ({fl/tb/1e9:.0f} GFLOP/s) per layer")
