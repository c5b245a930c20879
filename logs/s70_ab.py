"""The tail rule against the rule before it, in the shipped code path (diagnostic):
python logs/s70_ab.py U ROUNDS [auto,auto-old,auto-pure]

``auto`` is the default (DraftWhilePays, judged by the row the batch waits for when nobody waits); ``auto-old`` the
same policy told that someone always waits (every row's drafts count: the rule until stop 70); ``auto-pure`` the tail
rule with the other rows' drafts worth nothing (stop 70's first version); ``ar`` batched plain decoding. Bursts of U
users, 128 tokens each, methods rotated; aggregate and per-user ratios to ``ar``."""
import statistics
import sys
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching.policy import DraftWhilePays  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402


class AllRows(DraftWhilePays):
    def choose(self, rows, kind="", tail=False):
        return super().choose(rows, kind, tail=False)


class Pure(DraftWhilePays):
    def record(self, *a, **k):
        k["row_seconds"] = 0.0
        return super().record(*a, **k)


users, triples = int(sys.argv[1]), int(sys.argv[2])
variants = sys.argv[3].split(",") if len(sys.argv) > 3 else ["auto", "auto-old"]
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
policies = {"auto": DraftWhilePays(), "auto-old": AllRows(), "auto-pure": Pure()}
for spec in ("ar", "auto"):
    run_ours(sm, prompts[: max(2, users // 4)], spec, 8, max_batch=users)
agg, per = defaultdict(list), defaultdict(list)
order = ["ar"] + variants
for p in range(triples):
    for name in order[p % len(order):] + order[: p % len(order)]:
        if name != "ar":
            sm.batch_policy = policies[name]
        r = run_ours(sm, prompts, "ar" if name == "ar" else "auto", 128, max_batch=users)
        agg[name].append(sum(r["tokens"]) / r["wall"])
        per[name].append(statistics.mean(t / f for t, f in zip(r["tokens"], r["finish"])))
        print(f"{name:9s} {agg[name][-1]:6.1f} tok/s, per user {per[name][-1]:6.2f}, tau {r['tau']:.3f}", flush=True)
for name in variants:
    for label, d in (("aggregate", agg), ("per user", per)):
        x = [a / b for a, b in zip(d[name], d["ar"])]
        se = statistics.stdev(x) / len(x) ** 0.5
        print(f"{name:9s} {label:9s} / ar: mean {statistics.mean(x):.3f} +- {se:.3f}, "
              f"median {statistics.median(x):.3f}")
for a in variants:
    for b in variants:
        if a < b:
            x = [u / v for u, v in zip(agg[a], agg[b])]
            print(f"{a} / {b} aggregate, same round: mean {statistics.mean(x):.3f} +- "
                  f"{statistics.stdev(x) / len(x) ** 0.5:.3f}")
print("policy:", policies["auto"].summary())
