"""A drafting round against a plain one, piece by piece (diagnostic): python logs/s67_round_split.py U R [METHOD].

U rows at a time over U x R requests (steady load), rounds alternating drafting / plain (a forced policy); per mode,
ms per round of: the whole step, the forward, the head pass, propose, pack, accept, commit, observe, and the rest."""
import sys
import time
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import decode as bd  # noqa: E402
from drafttree.batching import target as bt  # noqa: E402
from drafttree.batching.policy import AlwaysDraft  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users, R = int(sys.argv[1]), int(sys.argv[2])
spec = sys.argv[3] if len(sys.argv) > 3 else "auto"
MODE = {"drafting": False}
acc = defaultdict(float)
cnt = defaultdict(int)


class Alternate(AlwaysDraft):
    n = 0

    def choose(self, rows, kind=""):
        self.n += 1
        MODE["drafting"] = rows == users and self.n % 2 == 0
        MODE["full"] = rows == users
        return MODE["drafting"] if rows > 1 else True


def timed(obj, name, label):
    orig = getattr(obj, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            if MODE.get("full"):
                key = ("draft " if MODE["drafting"] else "plain ") + label
                acc[key] += time.perf_counter() - t0
                cnt[key] += 1
    setattr(obj, name, wrapper)


timed(bd.BatchDecoder, "step", "step")
timed(bt.BatchTarget, "forward_trees", "forward")
timed(bt.BatchTarget, "commit", "commit")
timed(bt.BatchTarget, "_mask_and_positions", "mask")
timed(bd.BatchDecoder, "_head_pass", "head pass")
timed(bd.BatchDecoder, "_pack", "pack")
timed(bd, "accept", "accept")
timed(bd, "adjusted", "adjusted")
timed(bd.BatchDecoder, "_emit", "emit")
timed(bd.BatchDecoder, "_drop_finished", "drop")
orig_add = bd.BatchDecoder.add_many


def add_many(self, seqs):
    out = orig_add(self, seqs)
    for s in seqs:
        if not getattr(s.drafter, "_s67", False):
            s.drafter._s67 = True
            timed(s.drafter, "propose", "propose")
            timed(s.drafter, "observe", "observe")
    return out


bd.BatchDecoder.add_many = add_many
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users * R)
sm.batch_policy = Alternate()
run_ours(sm, prompts[:users], spec, 16, max_batch=users)
acc.clear()
cnt.clear()
verified = defaultdict(float)
orig_fwd = bt.BatchTarget.forward_trees


r = run_ours(sm, prompts, spec, 128, max_batch=users)
print(f"{spec} {users} x {R}: tau {r['tau']:.2f}")
for mode in ("plain", "draft"):
    n = cnt[f"{mode} step"]
    parts = {k.split(" ", 1)[1]: 1000 * v / n for k, v in acc.items() if k.startswith(mode)}
    known = sum(v for k, v in parts.items() if k not in ("step", "mask", "adjusted"))
    print(f"{mode}: {n} rounds; " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(parts.items(), key=lambda x: -x[1]))
          + f"; rest {parts['step'] - known:.2f} ms")
