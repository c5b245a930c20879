"""Alternated A/B in one process (diagnostic): batched `auto` with its default policy (DraftWhilePays, a fresh one each
run) and with a policy under which batched rounds never draft (a lone row still does: what `auto` costs beyond `ar`
when it drafts nothing), next to batched `ar`: U rows at a time over U x R requests (as `drafttree bench concurrency
--requests-per-user R`), 128 tokens, bf16, 2 threads. Usage: python logs/s66_plain_ab.py 16 4 3"""
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import target as bt  # noqa: E402
from drafttree.batching.policy import AlwaysDraft, DraftWhilePays  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402


class NeverDraft(AlwaysDraft):
    def choose(self, rows: int, kind: str = "") -> bool:
        return rows == 1



users = int(sys.argv[1]) if len(sys.argv) > 1 else 16
R = int(sys.argv[2]) if len(sys.argv) > 2 else 4
pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users * R)
run_ours(sm, prompts[:4], "auto", 16)
run_ours(sm, prompts[:4], "ar", 16)
seen = {"verified": 0, "rounds": 0}
orig = bt.BatchTarget.forward_trees


def fwd(self, trees):
    seen["verified"] += sum(t.size for t in trees)
    seen["rounds"] += 1
    return orig(self, trees)


bt.BatchTarget.forward_trees = fwd
res: dict[str, list] = {"auto (DraftWhilePays)": [], "auto (never in a batch)": [], "ar": []}
for rep in range(pairs):
    order = list(res) if rep % 2 == 0 else list(res)[::-1]
    for name in order:
        sm.batch_policy = NeverDraft() if name == "auto (never in a batch)" else DraftWhilePays()
        seen.update(verified=0, rounds=0)
        t0 = time.perf_counter()
        r = run_ours(sm, prompts, "ar" if name == "ar" else "auto", 128, max_batch=users)
        wall = time.perf_counter() - t0
        tps = sum(r["tokens"]) / wall
        res[name].append((tps, r["tau"], seen["verified"] / max(1, seen["rounds"]), seen["rounds"]))
        print(f"{name:26s} {tps:7.1f} tok/s  tau {r['tau']:.2f}  verified/round {res[name][-1][2]:.2f}  "
              f"rounds {seen['rounds']}  {sm.batch_policy.summary()}", flush=True)
print(f"--- {users} rows x {R} requests each, medians of {pairs}")
ar = statistics.median(x[0] for x in res["ar"])
for name, xs in res.items():
    m = statistics.median(x[0] for x in xs)
    print(f"{name:26s} {m:7.1f} tok/s  ({m / ar:.3f}x ar)  tau {statistics.median(x[1] for x in xs):.2f}  "
          f"rounds {statistics.median(x[3] for x in xs)}")
