"""What auto costs when it never drafts (diagnostic): python logs/s70_plain_cost.py U PAIRS.

Bursts of U users alternated: batched ``ar`` and ``auto`` under a policy that never drafts, so both run the same plain
rounds; per burst the time in prefills (add_many), in rounds (step) and in the forward of the rounds."""
import statistics
import sys
import time
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import decode as bd  # noqa: E402
from drafttree.batching.policy import DraftWhilePays  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

T = defaultdict(float)


def timed(cls, name, key):
    orig = getattr(cls, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            T[key] += time.perf_counter() - t0
    setattr(cls, name, wrapper)


timed(bd.BatchDecoder, "add_many", "prefill")
timed(bd.BatchDecoder, "step", "step")
timed(bd.BatchTarget, "forward_trees", "forward")


class Never(DraftWhilePays):
    def choose(self, rows, kind="", tail=False):
        super().choose(rows, kind, tail)
        return rows == 1


users, pairs = int(sys.argv[1]), int(sys.argv[2])
sm = drafttree.load(dtype="bfloat16")
sm.batch_policy = Never()
prompts = interleaved_prompts(list(BUILTIN), users)
for spec in ("ar", "auto"):
    run_ours(sm, prompts[: max(2, users // 4)], spec, 8, max_batch=users)
res = defaultdict(list)
for p in range(pairs):
    for spec in (("ar", "auto") if p % 2 == 0 else ("auto", "ar")):
        T.clear()
        r = run_ours(sm, prompts, spec, 128, max_batch=users)
        res[spec].append((r["wall"], T["prefill"], T["step"], T["forward"]))
        print(f"{spec:5s} wall {r['wall']:.3f}  prefill {T['prefill']:.3f}  steps {T['step']:.3f}  "
              f"forward {T['forward']:.3f}  tau {r['tau']:.3f}", flush=True)
for j, name in enumerate(("wall", "prefill", "steps", "forward")):
    a, b = [x[j] for x in res["auto"]], [x[j] for x in res["ar"]]
    print(f"{name:8s} auto {statistics.mean(a):.3f}  ar {statistics.mean(b):.3f}  "
          f"auto/ar paired median {statistics.median(x / y for x, y in zip(a, b)):.3f}")
