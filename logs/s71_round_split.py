"""Where a batched drafting round's time goes, against a plain round (diagnostic): python logs/s71_round_split.py U B

B bursts of U users x 128 tokens each, rotating a policy that drafts every round (AlwaysDraft), one that never drafts
in a batch and the default (DraftWhilePays, kept across bursts: its drafting and plain rounds apart); per round with at least U/2 rows, the mean milliseconds of: the whole round, the rows' proposals
(drafter.propose), the packing, the forward, the acceptance (accept), the drafters' observe, and the tokens verified."""
import statistics as st
import sys
import time
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import decode as bd  # noqa: E402
from drafttree.batching.policy import AlwaysDraft, DraftWhilePays  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402
from drafttree.drafters.hybrid import HybridDrafter  # noqa: E402

T = defaultdict(float)


def timed(owner, name, key):
    orig = getattr(owner, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            T[key] += time.perf_counter() - t0
    setattr(owner, name, wrapper)


timed(HybridDrafter, "propose", "propose")
timed(HybridDrafter, "observe", "observe")
timed(bd.BatchDecoder, "_pack", "pack")
timed(bd.BatchDecoder, "_head_pass", "head_pass")
timed(bd.BatchTarget, "forward_trees", "forward")
timed(bd, "accept", "accept")
timed(bd, "adjusted", "adjusted")
real_step = bd.BatchDecoder.step
rounds = defaultdict(list)
mode = ["plain"]


def step(self):
    T.clear()
    rows = self.rows
    t0 = time.perf_counter()
    out = real_step(self)
    if rows >= users // 2:
        tokens = sum(s.stats.tree_sizes[-1] for s in self.active) if self.active else 0
        name = mode[0] if mode[0] != "auto" else ("auto-draft" if T.get("propose") else "auto-plain")
        rounds[name].append(dict(T, round=time.perf_counter() - t0, rows=rows, tokens=tokens))
    return out


bd.BatchDecoder.step = step


class Never(DraftWhilePays):
    def choose(self, rows, kind="", tail=False):
        return rows == 1


users, bursts = int(sys.argv[1]), int(sys.argv[2])
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
run_ours(sm, prompts[:4], "auto", 8, max_batch=users)
variants = [("plain", Never()), ("draft", AlwaysDraft()), ("auto", DraftWhilePays())]
for b in range(bursts):
    for name, pol in variants[b % 3:] + variants[:b % 3]:
        mode[0], sm.batch_policy = name, pol
        run_ours(sm, prompts, "auto", 128, max_batch=users)
keys = ["round", "propose", "head_pass", "pack", "forward", "adjusted", "accept", "observe"]
print(f"{'mode':6s} rounds " + " ".join(f"{k:>9s}" for k in keys) + "  tokens/row")
for name in ("plain", "draft", "auto-plain", "auto-draft"):
    rs = rounds[name]
    if not rs:
        continue
    print(f"{name:6s} {len(rs):6d} " + " ".join(f"{st.mean(r.get(k, 0.0) for r in rs) * 1e3:9.2f}" for k in keys)
          + f"  {st.mean(r['tokens'] / r['rows'] for r in rs):.2f}")
