"""The kernel products of 140 shapes and row counts (float32, bf16, with and without a bias) saved to a file, to compare two builds bit for bit (stop 64, a diagnostic). Usage: python logs/s64_same_bits.py OUT.pt"""
import sys, torch
from drafttree.kernels import gemm
ext = gemm.small_gemm()
g = torch.Generator().manual_seed(0)
out = {}
for dt in (torch.float32, torch.bfloat16):
    for (n, k) in ((1536, 576), (576, 1536), (192, 576), (70, 64), (49152 // 16, 576)):
        w = (torch.randn(n, k, generator=g) / k**0.5).to(dt)
        b = torch.randn(n, generator=g).to(dt)
        for m in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 33, 48, 64):
            x = torch.randn(m, k, generator=g).to(dt)
            out[(str(dt), n, k, m)] = (ext.linear(x, w), ext.linear(x, w, b))
torch.save(out, sys.argv[1])
