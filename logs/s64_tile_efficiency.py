"""Single-thread bf16 products in cache: time against the vdpbf16ps count (one a cycle at 3.6 GHz) for 4-16 rows (stop 64, a diagnostic). Usage: python logs/s64_tile_efficiency.py"""
import torch, time, sys
torch.set_num_threads(1)
from drafttree.kernels import gemm
gemm.small_gemm(); ext = gemm._ext
def t(f, n=200):
    for _ in range(20): f()
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    return min(ts)
for (K,N) in [(576,1536),(1536,576),(3072, 288), (576, 192)]:
    w=torch.randn(N,K).bfloat16()
    for M in (4,6,8,12,16):
        x=torch.randn(M,K).bfloat16()
        hot = t(lambda: ext.linear(x, w, None))
        ideal = (M if M<=6 else (M//6*6 + (M%6))) * N * (K//32) / 3.6e9  # vdots / freq
        print(f"K{K} N{N} M{M:2d}: {hot*1e6:6.1f} us {2*M*K*N/hot/1e9:5.0f} GF/s  ideal-by-vdot {ideal*1e6:6.1f} us eff {ideal/hot:.2f}")
