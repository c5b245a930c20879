"""A burst's tail: should a drafting round be judged by the row that will finish last? (diagnostic)
python logs/s68_tail_policy.py U PAIRS

In a burst (nobody waiting) the rows that accept drafts finish early and the burst lasts as long as its last row,
which is the row drafts help least; DraftWhilePays counts every row's accepted drafts. Here a variant counts, per
drafting round, only the accepted drafts of the row with the most new tokens left (max_new_tokens - new_tokens),
scaled to the rows (as if every row were that one). Alternated bursts: ar, auto (default policy), auto (tail policy)."""
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
TAIL = {"on": False}
orig_step = bd.BatchDecoder.step


class TailPays(DraftWhilePays):
    def record(self, rows, drafted, tokens, seconds, measured=True, drafting=0.0, extra_verify=0.0, kind=""):
        crit = getattr(self, "critical", None)
        if crit is not None:  # the critical row's accepted drafts, as if every row had accepted as many
            tokens = rows + crit * rows
        super().record(rows, drafted, tokens, seconds, measured, drafting, extra_verify, kind)


def step(self):
    rows = list(self.active)
    crit = max(rows, key=lambda s: s.max_new_tokens - s.stats.new_tokens) if len(rows) > 1 else None
    before = crit.stats.new_tokens if crit is not None else 0
    if isinstance(self.policy, TailPays):
        self.policy.critical = None
        out = None
        # accepted drafts of the critical row are known after the round: record() runs inside step, so patch
        # accept lengths via a wrapper on the policy's record (set below through a closure)
        orig_record = self.policy.record

        def record(*a, **k):
            if crit is not None:
                self.policy.critical = max(0, crit.stats.accept_lengths[-1] - 1)
            return orig_record(*a, **k)
        self.policy.record = record
        try:
            out = orig_step(self)
        finally:
            del self.policy.record
            self.policy.critical = None
        return out
    del before
    return orig_step(self)


bd.BatchDecoder.step = step
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
policies = {"auto": DraftWhilePays(), "auto-tail": TailPays()}
for spec in ("ar", "auto"):
    run_ours(sm, prompts[: max(2, users // 4)], spec, 8, max_batch=users)
rates = defaultdict(list)
order = ["ar", "auto", "auto-tail"]
for p in range(pairs):
    for name in (order if p % 2 == 0 else order[::-1]):
        if name != "ar":
            sm.batch_policy = policies[name]
        r = run_ours(sm, prompts, "ar" if name == "ar" else "auto", 128, max_batch=users)
        rates[name].append(sum(r["tokens"]) / r["wall"])
        print(f"{name:10s} {rates[name][-1]:6.1f} tok/s tau {r['tau']:.3f}", flush=True)
for name in ("auto", "auto-tail"):
    ratios = sorted(a / b for a, b in zip(rates[name], rates["ar"]))
    print(f"{name} / ar per repeat: {[round(x, 3) for x in ratios]}, median {ratios[len(ratios) // 2]:.3f}")
