"""Where a batched round's time goes (diagnostic, not the benchmark): batched `ar` or `auto` with U users, 128 tokens,
the six tasks' first turns interleaved (as `drafttree bench concurrency`), bf16, 2 threads. Timers wrap the pieces
(no cProfile: it would inflate the Python parts). Prints seconds per piece and per round, and a lone sequence's
verify curve at the same token counts for comparison. Usage: python logs/s54_batch_split.py ar 16"""
import sys
import time
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import decode as bd  # noqa: E402
from drafttree.batching import target as bt  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

spec = sys.argv[1] if len(sys.argv) > 1 else "ar"
users = int(sys.argv[2]) if len(sys.argv) > 2 else 16
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
run_ours(sm, prompts[:4], spec, 16)  # warm-up

acc = defaultdict(float)
count = defaultdict(int)


def timed(cls, name, label):
    orig = getattr(cls, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            acc[label] += time.perf_counter() - t0
            count[label] += 1
    setattr(cls, name, wrapper)


timed(bd.BatchDecoder, "step", "step")
timed(bd.BatchDecoder, "add_many", "add_many (prefill)")
timed(bt.BatchTarget, "forward_trees", "forward_trees")
timed(bt.BatchTarget, "_mask_and_positions", "  mask+positions")
timed(bt.BatchTarget, "commit", "commit")
timed(bt.BatchTarget, "keep", "keep (rows leave)")
timed(bd.BatchDecoder, "_drop_finished", "drop_finished")
import drafttree.batching.decode as dmod  # noqa: E402

orig_accept = dmod.accept


def acc_wrap(*a, **k):
    t0 = time.perf_counter()
    try:
        return orig_accept(*a, **k)
    finally:
        acc["accept (per row)"] += time.perf_counter() - t0
dmod.accept = acc_wrap
orig_run = bt.run_with_features


def run_wrap(*a, **k):
    t0 = time.perf_counter()
    try:
        return orig_run(*a, **k)
    finally:
        acc["  model forward"] += time.perf_counter() - t0
        count["  model forward"] += 1
bt.run_with_features = run_wrap

t0 = time.perf_counter()
r = run_ours(sm, prompts, spec, 128)
wall = time.perf_counter() - t0
toks = sum(r["tokens"])
print(f"{spec} users {users}: {toks} tokens in {wall:.2f} s = {toks / wall:.1f} tok/s; tau {r['tau']:.2f}")
rounds = count["step"]
for k in sorted(acc, key=lambda k: -acc[k]):
    print(f"{k:24s} {acc[k]:7.3f} s  {1000 * acc[k] / max(1, rounds):7.2f} ms/round  calls {count[k]}")
print(f"{'outside step':24s} {wall - acc['step'] - acc['add_many (prefill)']:7.3f} s (stream callbacks, detok)")
cost = sm.verify_cost()
print("lone curve (cached):", {n: round(1000 * cost.verify(n), 2) for n in (1, 4, 8, 16, 32, 64)}, "ms")
