"""Does drafting in a burst pay at all on this CPU? (diagnostic): python logs/s71_never_ab.py U ROUNDS

Bursts of U users x 128 tokens, rotated in one process: batched ``ar``, ``auto`` (the default policy, kept across
bursts as the server keeps it) and ``never`` (auto's rows, no round drafts); aggregate ratios to ``ar`` and, per burst
of ``auto``, how many of its rounds drafted."""
import statistics
import sys
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching.policy import DraftWhilePays  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402


class Never(DraftWhilePays):
    def choose(self, rows, kind="", tail=False):
        super().choose(rows, kind, tail)
        return rows == 1


users, rounds = int(sys.argv[1]), int(sys.argv[2])
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
policies = {"auto": DraftWhilePays(), "never": Never()}
for spec in ("ar", "auto"):
    run_ours(sm, prompts[: max(2, users // 4)], spec, 8, max_batch=users)
agg, per = defaultdict(list), defaultdict(list)
order = ["ar", "auto", "never"]
for p in range(rounds):
    for name in order[p % 3:] + order[: p % 3]:
        if name != "ar":
            sm.batch_policy = policies[name]
        before = dict(policies["auto"]._rounds)
        r = run_ours(sm, prompts, "ar" if name == "ar" else "auto", 128, max_batch=users)
        agg[name].append(sum(r["tokens"]) / r["wall"])
        per[name].append(statistics.mean(t / f for t, f in zip(r["tokens"], r["finish"])))
        drafted = policies["auto"]._rounds["draft"] - before["draft"]
        plain = policies["auto"]._rounds["plain"] - before["plain"]
        extra = f", drafting rounds {drafted} of {drafted + plain}" if name == "auto" else ""
        print(f"{name:6s} {agg[name][-1]:6.1f} tok/s, per user {per[name][-1]:6.2f}, tau {r['tau']:.3f}{extra}",
              flush=True)
for name in ("auto", "never"):
    for label, d in (("aggregate", agg), ("per user", per)):
        x = [a / b for a, b in zip(d[name], d["ar"])]
        print(f"{name:6s} {label:9s} / ar: mean {statistics.mean(x):.3f} +- "
              f"{statistics.stdev(x) / len(x) ** 0.5:.3f}, median {statistics.median(x):.3f}")
x = [a / b for a, b in zip(agg["auto"], agg["never"])]
print(f"auto / never aggregate, same round: mean {statistics.mean(x):.3f} +- {statistics.stdev(x) / len(x) ** 0.5:.3f}")
print("policy:", policies["auto"].summary())
