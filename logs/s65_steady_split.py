"""Where a batched round's time goes under steady load (diagnostic, not the benchmark): U rows at a time over U x R
requests (the six tasks' first turns interleaved, as `drafttree bench concurrency --requests-per-user R`), 128 tokens,
bf16, 2 threads. Prints tokens/s, the round's pieces (ms per round), the tokens verified and accepted per round and
the drafters' propose time. Usage: python logs/s65_steady_split.py auto 16 4"""
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

spec = sys.argv[1] if len(sys.argv) > 1 else "auto"
users = int(sys.argv[2]) if len(sys.argv) > 2 else 16
R = int(sys.argv[3]) if len(sys.argv) > 3 else 4
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users * R)
run_ours(sm, prompts[:4], spec, 16)  # warm-up
acc, count = defaultdict(float), defaultdict(int)


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


orig_fwd = bt.BatchTarget.forward_trees


def fwd(self, trees):
    acc["tokens verified"] += sum(t.size for t in trees)
    acc["rows"] += len(trees)
    return orig_fwd(self, trees)


bt.BatchTarget.forward_trees = fwd
timed(bd.BatchDecoder, "step", "step")
timed(bd.BatchDecoder, "add_many", "add_many (prefill)")
timed(bt.BatchTarget, "forward_trees", "forward_trees")
timed(bd.BatchDecoder, "_pack", "pack")
timed(bd.BatchDecoder, "_head_pass", "head pass")
orig_accept = bd.accept


def acc_wrap(*a, **k):
    t0 = time.perf_counter()
    try:
        out = orig_accept(*a, **k)
        acc["tokens accepted"] += len(out[0])
        return out
    finally:
        acc["accept (per row)"] += time.perf_counter() - t0


bd.accept = acc_wrap
orig_propose, orig_observe = {}, {}


def wrap_drafters(dec_self, seq):
    d = seq.drafter
    if getattr(d, "_s65", False):
        return
    d._s65 = True
    p, o = d.propose, d.observe

    def propose(req):
        t0 = time.perf_counter()
        try:
            return p(req)
        finally:
            acc["propose (per row)"] += time.perf_counter() - t0

    def observe(*a, **k):
        t0 = time.perf_counter()
        try:
            return o(*a, **k)
        finally:
            acc["observe (per row)"] += time.perf_counter() - t0
    d.propose, d.observe = propose, observe


orig_add_many = bd.BatchDecoder.add_many


def add_many(self, seqs):
    out = orig_add_many(self, seqs)
    for s in seqs:
        wrap_drafters(self, s)
    return out


bd.BatchDecoder.add_many = add_many
_, model_drafter = None, None
t0 = time.perf_counter()
r = run_ours(sm, prompts, spec, 128, max_batch=users)
wall = time.perf_counter() - t0
toks = sum(r["tokens"])
rounds = count["step"]
print(f"{spec} {users} rows x {R}: {toks} tokens in {wall:.2f} s = {toks / wall:.1f} tok/s; tau {r['tau']:.2f}, "
      f"rounds {rounds}, rows/round {acc['rows'] / rounds:.2f}, verified/round {acc['tokens verified'] / rounds:.2f}, "
      f"accepted/round {acc['tokens accepted'] / rounds:.2f}")
for k in ("step", "forward_trees", "head pass", "pack", "accept (per row)", "propose (per row)", "observe (per row)",
          "add_many (prefill)"):
    print(f"{k:24s} {acc[k]:7.3f} s  {1000 * acc[k] / max(1, rounds):7.2f} ms/round  calls {count[k]}")
print(f"{'step - forward':24s} {1000 * (acc['step'] - acc['forward_trees']) / rounds:7.2f} ms/round")
