"""Per product kind at ROWS rows (stop 58): the 30 layers' q/k/v (fused), o, gate/up, down, then the LM head and a whole layer, builds alternated, the fastest of REPS. Usage: python logs/s58_ab_per_product.py BUILD_A BUILD_B ROWS REPS"""
import sys, time
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from ab_builds import load_build, smollm2_weights
torch.set_num_threads(2)
exts = {"A": load_build(sys.argv[1], "A"), "B": load_build(sys.argv[2], "B")}
g = torch.Generator().manual_seed(0)
H, I, KV, V = 576, 1536, 192, 49152
layers, head = smollm2_weights(exts, g)
m = int(sys.argv[3])
x = torch.randn(m, H, generator=g).bfloat16(); xi = torch.randn(m, I, generator=g).bfloat16()
kinds = {
 "qkv": lambda e: [e.linears(x, [L["q"], L["k"], L["v"]], []) for L in layers],
 "o": lambda e: [e.linear(x, L["o"]) for L in layers],
 "gate/up": lambda e: [e.linears(x, [L["gate"], L["up"]], []) for L in layers],
 "down": lambda e: [e.linear(xi, L["down"]) for L in layers],
 "head": lambda e: e.linear(x, head),
 "layer": lambda e: [(e.linears(x, [L["q"], L["k"], L["v"]], []), e.linear(x, L["o"]), e.linears(x, [L["gate"], L["up"]], []), e.linear(xi, L["down"])) for L in layers],
}
for name, f in kinds.items():
    best = {k: 1e9 for k in exts}
    for _ in range(int(sys.argv[4])):
        for k, e in exts.items():
            t0 = time.perf_counter(); f(e); best[k] = min(best[k], time.perf_counter() - t0)
    print(f"{name:8s} A {best['A']*1e3:7.3f} ms  B {best['B']*1e3:7.3f} ms  B/A {best['B']/best['A']:.3f}", flush=True)
