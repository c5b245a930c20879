"""What the batch policy sees in a burst (diagnostic): python logs/s67_policy_trace.py U [METHOD].

Per drafting round of 2+ rows: rows, accepted drafts, drafting ms, modelled extra verify ms, the rest ms, and
whether the bucket pays after the round; then the policy's decayed sums per bucket."""
import sys
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import policy as bp  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users = int(sys.argv[1])
spec = sys.argv[2] if len(sys.argv) > 2 else "auto"
orig = bp.DraftWhilePays.record
ROUNDS = defaultdict(list)


def record(self, rows, drafted, tokens, seconds, measured=True, drafting=0.0, extra_verify=0.0, kind=""):
    orig(self, rows, drafted, tokens, seconds, measured, drafting, extra_verify, kind)
    if rows >= 2:
        ROUNDS[rows].append((drafted, tokens - rows, 1000 * drafting, 1000 * extra_verify,
                             1000 * (seconds - drafting - extra_verify), self.pays((bp.bucket(rows), kind))))


bp.DraftWhilePays.record = record
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
for rep in range(3):
    ROUNDS.clear()
    r = run_ours(sm, prompts, spec, 128, max_batch=users)
    print(f"run {rep}: {sum(r['tokens']) / r['wall']:.1f} tok/s tau {r['tau']:.2f}")
    for rows, rs in sorted(ROUNDS.items(), reverse=True):
        d = [x for x in rs if x[0]]
        p = [x for x in rs if not x[0]]
        if d:
            n = len(d)
            print(f"  {rows} rows: {n} drafting rounds: accepted/round {sum(x[1] for x in d) / n:.2f}, drafting "
                  f"{sum(x[2] for x in d) / n:.2f} ms, extra verify {sum(x[3] for x in d) / n:.2f} ms, rest "
                  f"{sum(x[4] for x in d) / n:.2f} ms; pays after: {[int(x[5]) for x in d]}")
        if p:
            print(f"  {rows} rows: {len(p)} plain rounds: {sum(x[4] for x in p) / len(p):.2f} ms")
    print("  sums", {k: [round(v, 3) for v in s] for k, s in sm.batch_policy.sums.items()})
