"""A burst's tail, measured with enough pairs (diagnostic): python logs/s70_tail_ab.py U PAIRS.

Like logs/s68_tail_policy.py (the policy ``auto-tail`` judges drafting rounds by the accepted drafts of the row with the
most tokens left, as if every row had accepted as many), with per-user speed beside the aggregate and mean ratios with
their standard errors. Methods rotate each pair so that none always runs first."""
import statistics
import sys
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import decode as bd  # noqa: E402
from drafttree.batching.policy import DraftWhilePays  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users, pairs = int(sys.argv[1]), int(sys.argv[2])
orig_step = bd.BatchDecoder.step


class TailPays(DraftWhilePays):
    critical = None

    def record(self, rows, drafted, tokens, seconds, measured=True, drafting=0.0, extra_verify=0.0, kind=""):
        if self.critical is not None:  # the critical row's accepted drafts, as if every row had accepted as many
            tokens = rows + self.critical * rows
        super().record(rows, drafted, tokens, seconds, measured, drafting, extra_verify, kind)


def step(self):
    if not isinstance(self.policy, TailPays) or len(self.active) < 2:
        return orig_step(self)
    left = {id(s): s.max_new_tokens - s.stats.new_tokens for s in self.active}
    most = max(left.values())
    crit = [s for s in self.active if left[id(s)] == most]
    n0 = {id(s): len(s.stats.accept_lengths) for s in crit}
    orig_record = self.policy.record

    def record(*a, **k):
        acc = [s.stats.accept_lengths[-1] - 1 for s in crit if len(s.stats.accept_lengths) > n0[id(s)]]
        self.policy.critical = min(acc) if acc else 0
        return orig_record(*a, **k)
    self.policy.record = record
    try:
        return orig_step(self)
    finally:
        del self.policy.record
        self.policy.critical = None


bd.BatchDecoder.step = step
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
policies = {"auto": DraftWhilePays(), "auto-tail": TailPays()}
for spec in ("ar", "auto"):
    run_ours(sm, prompts[: max(2, users // 4)], spec, 8, max_batch=users)
agg, per = defaultdict(list), defaultdict(list)
order = ["ar", "auto", "auto-tail"]
for p in range(pairs):
    for name in order[p % 3:] + order[: p % 3]:
        if name != "ar":
            sm.batch_policy = policies[name]
        r = run_ours(sm, prompts, "ar" if name == "ar" else "auto", 128, max_batch=users)
        agg[name].append(sum(r["tokens"]) / r["wall"])
        per[name].append(statistics.mean(t / f for t, f in zip(r["tokens"], r["finish"])))
        print(f"{name:10s} {agg[name][-1]:6.1f} tok/s, per user {per[name][-1]:6.2f}, tau {r['tau']:.3f}", flush=True)
for name in ("auto", "auto-tail"):
    for label, d in (("aggregate", agg), ("per user", per)):
        x = [a / b for a, b in zip(d[name], d["ar"])]
        se = statistics.stdev(x) / len(x) ** 0.5
        print(f"{name:10s} {label:9s} / ar: mean {statistics.mean(x):.3f} +- {se:.3f}, "
              f"median {statistics.median(x):.3f}")
