"""The bf16 linears' rate per row count on this CPU (diagnostic): python logs/s71_gemm_rate.py vector panels vector

SmolLM2-135M's seven linear shapes x 30 layers (no LM head), random bf16 weights, through drafttree.kernels.gemm.linear,
best of 5; ``vector``: the small-GEMM kernel's vector path (AVX-512 here), ``panels``: the AVX2 panels forced on."""
import sys
import time

import torch

torch.set_num_threads(2)
from drafttree.kernels import gemm
ext = gemm.small_gemm()
print("status", gemm.kernel_status(), "panels", gemm.panels_on(), "MAX_ROWS", gemm.MAX_ROWS)
torch.manual_seed(0)
# SmolLM2-135M layer shapes: q 576x576, k/v 192x576, o 576x576, gate/up 1536x576, down 576x1536; 30 layers
shapes = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
ws = [torch.randn(n, k).to(torch.bfloat16) for n, k in shapes * 30]
flops_per_row = 2 * sum(n * k for n, k in shapes) * 30
def run(M):
    xs = {k: torch.randn(M, k).to(torch.bfloat16) for k in (576, 1536)}
    with torch.inference_mode():
        for w in ws[:7]:
            gemm.linear(xs[w.shape[1]], w)
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            for w in ws:
                gemm.linear(xs[w.shape[1]], w)
            best = min(best, time.perf_counter() - t0)
    return best
for mode in sys.argv[1:]:
    if mode == "panels":
        ext.set_panels(True)
    else:
        ext.set_panels(False)
    res = []
    for M in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64):
        t = run(M)
        res.append(f"M={M}: {t*1e3:.2f} ms {flops_per_row*M/t/1e9:.0f} GF/s")
    print(mode, gemm.panels_on(), "; ".join(res))
