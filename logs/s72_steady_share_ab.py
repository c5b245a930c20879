"""A steady load with shared prefixes taken from rows still decoding, against none (diagnostic):
python logs/s72_steady_share_ab.py U R ROUNDS [METHOD]

U users x R requests in turn each (the concurrency benchmark's steady load: a newcomer joins as a row finishes), the
same batched target alternated between share_at_least = 8 (the default: a newcomer computes only what follows the
prefix it shares with a row in the batch or another newcomer) and 0 (every prompt whole), the order swapped every
round; aggregate tokens/s per run and the ratio of each round's pair."""
import statistics
import sys

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users, per, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
method = sys.argv[4] if len(sys.argv) > 4 else "ar"
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users * per)
bt = sm.batch_target()
shared = []
real = bt.add_many


def add_many(ids, room=None):
    out = real(ids, room)
    shared.extend(bt.last_shared)
    return out


bt.add_many = add_many
run_ours(sm, prompts[:users], method, 8, max_batch=users)  # warm-up
tps = {8: [], 0: []}
for r in range(rounds):
    for share in ((8, 0) if r % 2 == 0 else (0, 8)):
        bt.share_at_least = share
        shared.clear()
        res = run_ours(sm, prompts, method, 128, max_batch=users)
        tps[share].append(sum(res["tokens"]) / res["wall"])
        print(f"share_at_least={share}: {tps[share][-1]:6.1f} tok/s, {len(shared)} newcomers, "
              f"{sum(1 for s in shared if s)} sharing, {sum(shared)} tokens copied", flush=True)
x = [a / b for a, b in zip(tps[8], tps[0])]
print(f"# python logs/s72_steady_share_ab.py {users} {per} {rounds} {method}: shared / whole, each round's pair: "
      f"mean {statistics.mean(x):.3f} +- {statistics.stdev(x) / len(x) ** 0.5:.3f}, median {statistics.median(x):.3f}")
