"""A burst's packed prefill with shared prefixes computed once, against each prompt computed whole (diagnostic):
python logs/s72_shared_prefill.py U R

The concurrency benchmark's U prompts (interleaved from the six tasks) prefilled together into a fresh batch, R rounds
alternating BatchTarget.share_at_least = 8 (the default) and 0 (every prompt whole), the order swapped every round:
seconds per prefill, the tokens copied instead of computed, and whether both give the same logits and features."""
import statistics as st
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users, rounds = int(sys.argv[1]), int(sys.argv[2])
sm = drafttree.load(dtype="bfloat16")
ids = [sm.encode_prompt(p) for p in interleaved_prompts(list(BUILTIN), users)]
n = sum(int(i.numel()) for i in ids)
times: dict[int, list[float]] = {8: [], 0: []}
outs = {}
for r in range(rounds):
    for share in ((8, 0) if r % 2 == 0 else (0, 8)):
        bt = sm.batch_target()
        bt.keep([])
        bt.share_at_least = share
        t0 = time.perf_counter()
        outs[share] = bt.add_many(ids, [128] * len(ids))
        times[share].append(time.perf_counter() - t0)
        if share:
            shared = sum(bt.last_shared)
        bt.keep([])
same = all(torch.equal(a.logits, b.logits) and torch.equal(a.features, b.features) for a, b in zip(outs[8], outs[0]))
print(f"# python logs/s72_shared_prefill.py {users} {rounds}: {n} prompt tokens, {shared} of them copied from a shared "
      f"prefix; same logits and features: {same}")
for share, ts in times.items():
    print(f"share_at_least={share}: median {st.median(ts):.3f} s  (" + " ".join(f"{t:.3f}" for t in ts) + ")")
print(f"ratio of medians {st.median(times[8]) / st.median(times[0]):.3f}")
