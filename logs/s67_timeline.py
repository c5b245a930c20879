"""Where a burst's wall time goes by batch size (diagnostic): python logs/s67_timeline.py U PAIRS [TOKENS].

Runs ``auto`` and ``ar`` alternated on the same U prompts (a burst), and per method prints the seconds, rounds and
tokens spent at each number of live rows, the rounds that drafted, and when each row finished."""
import statistics
import sys
import time
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import decode as bdecode  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users, pairs = int(sys.argv[1]), int(sys.argv[2])
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 128
LOG: list = []
orig_step = bdecode.BatchDecoder.step


def step(self):
    rows = len(self.active)
    d0, t0 = self.policy._rounds["draft"], time.perf_counter()
    out = orig_step(self)
    LOG.append((rows, time.perf_counter() - t0, sum(len(n) for _, n in out), self.policy._rounds["draft"] - d0))
    return out


bdecode.BatchDecoder.step = step
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
for m in ("auto", "ar"):
    run_ours(sm, prompts, m, 8, max_batch=users)  # warm: this batch size's shapes and allocations
agg = defaultdict(list)
for p in range(pairs):
    for m in (("auto", "ar") if p % 2 == 0 else ("ar", "auto")):
        LOG.clear()
        r = run_ours(sm, prompts, m, tokens, max_batch=users)
        by = defaultdict(lambda: [0.0, 0, 0, 0])
        for rows, sec, n, drafted in LOG:
            b = by[rows]
            b[0] += sec
            b[1] += 1
            b[2] += n
            b[3] += drafted
        tps = sum(r["tokens"]) / r["wall"]
        agg[m].append(tps)
        parts = "  ".join(f"{k}r: {v[0]:.2f}s/{v[1]}rd/{v[2]}tok/{v[3]}dr" for k, v in sorted(by.items(), reverse=True))
        fin = ", ".join(f"{f:.1f}" for f in sorted(r["finish"]))
        print(f"{m:5s} {tps:6.1f} tok/s wall {r['wall']:.2f} tau {r['tau']:.2f}  {parts}  finish {fin}", flush=True)
for m, v in agg.items():
    print(m, "median", round(statistics.median(v), 1))
print("auto/ar paired", [round(a / b, 3) for a, b in zip(agg["auto"], agg["ar"])])
