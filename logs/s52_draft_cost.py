"""Stop 52 diagnostic (not the benchmark): wall time of auto's drafter calls (propose, observe) per row-round, in a
burst of U users (bench concurrency's prompts) and one user alone. Usage: s52_draft_cost.py U [max_new_tokens]"""
import sys, time, torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts, run_ours
from drafttree.bench.tasks import BUILTIN
from drafttree.drafters.hybrid import HybridDrafter
sm = drafttree.load(dtype="bfloat16")
u = int(sys.argv[1]) if len(sys.argv) > 1 else 4
mnt = int(sys.argv[2]) if len(sys.argv) > 2 else 128
prompts = interleaved_prompts(list(BUILTIN), u)
acc = {"propose": [0, 0.0], "observe": [0, 0.0]}
for name in acc:
    orig = getattr(HybridDrafter, name)
    def wrap(self, *a, _o=orig, _n=name):
        t = time.perf_counter(); r = _o(self, *a); acc[_n][0] += 1; acc[_n][1] += time.perf_counter() - t; return r
    setattr(HybridDrafter, name, wrap)
run_ours(sm, prompts[:2], "auto", 16)
for spec in ("ar", "auto", "ar", "auto"):
    for v in acc.values():
        v[:] = [0, 0.0]
    r = run_ours(sm, prompts, spec, mnt)
    print(f"{spec:5s} {sum(r['tokens'])/r['wall']:6.1f} tok/s wall {r['wall']:.2f} s tau {r['tau']:.2f} tree {r['tree']:.2f}",
          "  ".join(f"{k} {v[0]} calls {1e3*v[1]/max(1,v[0]):.3f} ms each, {v[1]:.3f} s" for k, v in acc.items()))
