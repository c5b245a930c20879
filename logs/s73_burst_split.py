"""Where a burst's time goes (stop 73, a diagnostic): prefill forwards, decode rounds (their forwards), the rest.
Usage: python logs/s73_burst_split.py USERS REPEATS METHOD...   (methods as in bench concurrency; interleaved)"""
import statistics
import sys
import time

import torch

import drafttree
from drafttree.batching.target import BatchTarget
from drafttree.bench.concurrency import interleaved_prompts, run_ours
from drafttree.bench.tasks import BUILTIN

torch.set_num_threads(2)
users, repeats, methods = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
clock = {"prefill": 0.0, "forward": 0.0, "rounds": 0, "prefills": 0}
add_many, forward_trees = BatchTarget.add_many, BatchTarget.forward_trees


def timed_add(self, *a, **k):
    t0 = time.perf_counter()
    out = add_many(self, *a, **k)
    clock["prefill"] += time.perf_counter() - t0
    clock["prefills"] += 1
    return out


def timed_forward(self, *a, **k):
    t0 = time.perf_counter()
    out = forward_trees(self, *a, **k)
    clock["forward"] += time.perf_counter() - t0
    clock["rounds"] += 1
    return out


BatchTarget.add_many, BatchTarget.forward_trees = timed_add, timed_forward
for m in methods:
    run_ours(sm, prompts, m, 128)  # warm
res = {m: [] for m in methods}
for _ in range(repeats):
    for m in methods:
        for k in clock:
            clock[k] = 0
        r = run_ours(sm, prompts, m, 128)
        res[m].append((r["wall"], sum(r["tokens"]), dict(clock)))
print(f"# python logs/s73_burst_split.py {' '.join(sys.argv[1:])}")
for m, runs in res.items():
    w = statistics.median(x[0] for x in runs)
    for wall, tok, c in runs:
        print(f"{m:10s} wall {wall:6.3f} s tokens {tok} agg {tok / wall:6.1f} tok/s  prefill {c['prefill']:.3f} s "
              f"({c['prefills']})  rounds {c['rounds']} forwards {c['forward']:.3f} s "
              f"({c['forward'] / max(1, c['rounds']) * 1e3:.1f} ms)"
              f"  other {wall - c['prefill'] - c['forward']:.3f} s")
    print(f"{m:10s} median wall {w:.3f}")
