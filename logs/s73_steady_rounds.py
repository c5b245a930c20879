"""A steady load's rounds, auto against ar (stop 73, a diagnostic): python logs/s73_steady_rounds.py U R PAIRS

Per method, over PAIRS alternated runs: the plain rounds' and the drafting rounds' count and mean milliseconds by
row count (8-15, 16), and the time in prefill."""
import statistics
import sys
import time
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching.decode import BatchDecoder  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users, per, pairs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users * per)
step, add_many = BatchDecoder.step, BatchDecoder.add_many
log = defaultdict(list)
cur = ["ar"]


def timed_step(self):
    n = len(self.active)
    pol = sm.batch_policy
    d0 = pol._rounds["draft"]
    t0 = time.perf_counter()
    out = step(self)
    dt = time.perf_counter() - t0
    drafted = pol._rounds["draft"] > d0
    log[(cur[0], "draft" if drafted else "plain", 16 if n >= 16 else 8 if n >= 8 else n)].append(dt)
    return out


def timed_add(self, seqs):
    t0 = time.perf_counter()
    out = add_many(self, seqs)
    log[(cur[0], "prefill", len(seqs))].append(time.perf_counter() - t0)
    return out


BatchDecoder.step, BatchDecoder.add_many = timed_step, timed_add
for m in ("auto", "ar"):
    cur[0] = m
    run_ours(sm, prompts[:users], m, 32, max_batch=users)
log.clear()
for r in range(pairs):
    for m in (("auto", "ar") if r % 2 == 0 else ("ar", "auto")):
        cur[0] = m
        run_ours(sm, prompts, m, 128, max_batch=users)
print(f"# python logs/s73_steady_rounds.py {' '.join(sys.argv[1:])}")
for k in sorted(log):
    v = log[k]
    print(f"{k[0]:5s} {k[1]:7s} {k[2]:3d}: {len(v):5d} x {statistics.mean(v) * 1e3:7.2f} ms (median "
          f"{statistics.median(v) * 1e3:7.2f}) = {sum(v):6.2f} s")
