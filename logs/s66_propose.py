"""Where a batched drafting round's propose time goes (diagnostic): U rows x R requests of `auto`, every propose call
timed, split into each row's first call and the rest, and the slowest calls profiled. Usage:
python logs/s66_propose.py 64 1"""
import cProfile
import pstats
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import decode as bd  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users = int(sys.argv[1]) if len(sys.argv) > 1 else 64
R = int(sys.argv[2]) if len(sys.argv) > 2 else 1
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users * R)
run_ours(sm, prompts[:4], "auto", 16)
first, later, sizes = [], [], []
prof = cProfile.Profile()
orig_add_many = bd.BatchDecoder.add_many


def add_many(self, seqs):
    out = orig_add_many(self, seqs)
    for s in seqs:
        d = s.drafter
        p = d.propose
        d._n = 0

        def propose(req, d=d, p=p):
            t0 = time.perf_counter()
            prof.enable()
            try:
                tree = p(req)
                sizes.append(tree.size)
                return tree
            finally:
                prof.disable()
                (first if d._n == 0 else later).append(time.perf_counter() - t0)
                d._n += 1
        d.propose = propose
    return out


bd.BatchDecoder.add_many = add_many
t0 = time.perf_counter()
r = run_ours(sm, prompts, "auto", 128, max_batch=users)
print(f"{sum(r['tokens'])} tokens in {time.perf_counter() - t0:.1f} s, tau {r['tau']:.2f}")
print(f"first calls: {len(first)}, {1000 * sum(first):.1f} ms, mean {1000 * sum(first) / max(1, len(first)):.3f} ms")
print(f"later calls: {len(later)}, {1000 * sum(later):.1f} ms, mean {1000 * sum(later) / max(1, len(later)):.3f} ms")
print(f"trees > 1 token: {sum(s > 1 for s in sizes)} of {len(sizes)}")
pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
