"""The bf16 linears of one SmolLM2-135M layer shape at a time, in cache (stop 73, a diagnostic for
logs/s73_dot_tiles.log): python logs/s73_dot_tiles.py"""
import time

import torch

from drafttree.kernels import gemm

torch.set_num_threads(2)
gemm.small_gemm()
torch.manual_seed(0)
for n, k in [(1536, 576), (576, 1536), (576, 576)]:
    w = torch.randn(n, k).to(torch.bfloat16)
    for m in (4, 8, 12, 16, 24, 32):
        x = torch.randn(m, k).to(torch.bfloat16)
        with torch.inference_mode():
            for _ in range(20):
                gemm.linear(x, w)
            best = 1e9
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(100):
                    gemm.linear(x, w)
                best = min(best, (time.perf_counter() - t0) / 100)
        print(f"{n}x{k} M={m}: {best * 1e6:.1f} us {2 * m * n * k / best / 1e9:.0f} GF/s")
