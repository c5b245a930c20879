"""In-process A/B of two kernel builds on one SmolLM2-135M layer's bf16 products plus its LM head (stop 57): every
product of a layer (q/k/v, o, gate/up, down) and the 49152-row LM head, at each row count, builds alternated, the
fastest of REPS passes. Usage: python logs/s57_ab_products.py BUILD_A BUILD_B ROWS REPS"""
import sys
import time

import torch
from ab_builds import load_build, smollm2_weights


torch.set_num_threads(2)


exts = {"A": load_build(sys.argv[1], "A"), "B": load_build(sys.argv[2], "B")}
g = torch.Generator().manual_seed(0)
H, I, KV, V = 576, 1536, 192, 49152
layers, head = smollm2_weights(exts, g)


def forward(ext, m):
    x = torch.randn(m, H, generator=g).bfloat16()
    t0 = time.perf_counter()
    for L in layers:
        ext.linears(x, [L["q"], L["k"], L["v"]], [])
        ext.linear(x, L["o"])
        gu = ext.linears(x, [L["gate"], L["up"]], [])
        ext.linear(gu[0], L["down"])
    ext.linear(x, head)
    return time.perf_counter() - t0


for m in [int(s) for s in sys.argv[3].split(",")]:
    best = {k: 1e9 for k in exts}
    for k, e in exts.items():
        forward(e, m)
    for _ in range(int(sys.argv[4])):
        for k, e in exts.items():
            best[k] = min(best[k], forward(e, m))
    flops = 2 * m * (30 * (H * (H + 2 * KV) + H * H + 3 * H * I) + V * H)
    print(f"{m:3d} rows: A {best['A'] * 1e3:7.2f} ms  B {best['B'] * 1e3:7.2f} ms  B/A {best['B'] / best['A']:.3f}"
          f"  B {flops / best['B'] / 1e9:6.1f} GFLOP/s", flush=True)
