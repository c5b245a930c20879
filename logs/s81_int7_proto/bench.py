"""Stop 81 probe: could a 7-bit weight copy of SmolLM2-135M draft cheaply on this CPU? A prototype product (weights
u in [0, 127] as bf16 words 0x4300 | u = 128 + u, so vdpbf16ps multiplies them without a conversion; the offset and
a per-row scale applied after the sum) against the project's bf16 kernel, over 30 layers' worth of distinct weights
(streamed from memory, as in a decode step), M rows at a time; then the per-call overhead and an LM-head product.
python logs/s81_int7_proto/bench.py   (output: logs/s81_int7_proto/bench.log; "int8 proto" there is this 7-bit one)"""
import time

import torch
from torch.utils.cpp_extension import load

from drafttree.kernels import gemm

torch.set_num_threads(2)
q7 = load("q7proto", ["logs/s81_int7_proto/int7.cpp"], extra_cflags=["-O3", "-march=native", "-fopenmp"])
ext = gemm.small_gemm()
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # one layer
LAYERS = 30


def timed(f, n: int, warm: int) -> float:
    for _ in range(warm):
        f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n


w = torch.randn(64, 576)
s = w.abs().amax(1) / 63
q = (w / s[:, None]).round().clamp(-63, 63)
x = torch.randn(3, 576).to(torch.bfloat16)
got = q7.int7_linear(x, (q + 64).to(torch.uint8), s.float()).float()
print("max err", (got - x.float() @ (q * s[:, None]).T).abs().max().item())  # the bf16 rounding of the output
bf16 = [[torch.randn(n, k).to(torch.bfloat16) for n, k in SHAPES] for _ in range(LAYERS)]
codes = [[(torch.randint(0, 127, (n, k), dtype=torch.uint8), torch.rand(n)) for n, k in SHAPES] for _ in range(LAYERS)]
for m in (1, 2, 4, 8):
    xs = {k: torch.randn(m, k).to(torch.bfloat16) for k in (576, 1536)}
    tb = timed(lambda xs=xs: [ext.linear(xs[v.shape[1]], v, None) for layer in bf16 for v in layer], 20, 3)
    ti = timed(lambda xs=xs: [q7.int7_linear(xs[c.shape[1]], c, sc) for layer in codes for c, sc in layer], 20, 3)
    print(f"M={m}: 30 layers' linears bf16 kernel {1e3 * tb:.2f} ms, int8 proto {1e3 * ti:.2f} ms")
x = torch.randn(1, 576).to(torch.bfloat16)
tiny, tiny_scale, tiny_bf16 = torch.randint(0, 127, (4, 576), dtype=torch.uint8), torch.rand(4), bf16[0][1][:4].clone()
print("int7 tiny", 1e6 * timed(lambda: q7.int7_linear(x, tiny, tiny_scale), 2000, 100), "us")
print("bf16 tiny", 1e6 * timed(lambda: ext.linear(x, tiny_bf16, None), 2000, 100), "us")
head, head_scale = torch.randint(0, 127, (49152, 576), dtype=torch.uint8), torch.rand(49152)
print("lm head int7", 1e3 * timed(lambda: q7.int7_linear(x, head, head_scale), 50, 5), "ms")
