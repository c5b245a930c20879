"""Stop 52 diagnostic (not the benchmark): time spent in Python's cyclic garbage collector during a burst of U users
(bench concurrency's prompts), per generation, with and without gc.freeze() after loading. Usage: s52_gc.py U spec"""
import gc, sys, time, torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts, run_ours
from drafttree.bench.tasks import BUILTIN
sm = drafttree.load(dtype="bfloat16")
u = int(sys.argv[1]) if len(sys.argv) > 1 else 64
spec = sys.argv[2] if len(sys.argv) > 2 else "auto"
prompts = interleaved_prompts(list(BUILTIN), u)
run_ours(sm, prompts[:2], spec, 16)
stats = {}
t = [0.0]
def cb(phase, info):
    if phase == "start":
        t[0] = time.perf_counter()
    else:
        g = info["generation"]; n, s = stats.get(g, (0, 0.0)); stats[g] = (n + 1, s + time.perf_counter() - t[0])
gc.callbacks.append(cb)
for freeze in (False, True, False, True):
    if freeze:
        gc.collect(); gc.freeze()
    else:
        gc.unfreeze()
    stats.clear()
    r = run_ours(sm, prompts, spec, 128)
    print(f"freeze={freeze} objects tracked {len(gc.get_objects())} frozen {gc.get_freeze_count()} "
          f"{sum(r['tokens'])/r['wall']:.1f} tok/s wall {r['wall']:.2f} s gc:",
          {g: (n, round(s, 3)) for g, (n, s) in sorted(stats.items())})
