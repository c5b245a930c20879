"""Is a drafting round's forward as dear as the policy is told? (diagnostic): python logs/s68_draft_rounds.py U RUNS.

Bursts of U users with ``auto``; per row count, the forward of plain rounds (mean ms), of drafting rounds, the
tokens they verified, and the extra verify the policy was charged (the curve's) against the measured difference."""
import sys
import time
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import decode as bd  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users, runs = int(sys.argv[1]), int(sys.argv[2])
CUR = {}
STATS = defaultdict(list)  # (rows, drafted) -> [(forward ms, tokens, charged extra ms, drafting ms)]
orig_fwd, orig_record = bd.BatchTarget.forward_trees, bd.DraftWhilePays.record


def forward_trees(self, trees):
    t0 = time.perf_counter()
    out = orig_fwd(self, trees)
    CUR["fwd"], CUR["tokens"] = 1000 * (time.perf_counter() - t0), sum(t.size for t in trees)
    return out


def record(self, rows, drafted, tokens, seconds, measured=True, drafting=0.0, extra_verify=0.0, kind=""):
    orig_record(self, rows, drafted, tokens, seconds, measured, drafting, extra_verify, kind)
    if measured and rows >= 2:
        STATS[rows, drafted and CUR["tokens"] > rows].append((CUR["fwd"], CUR["tokens"], 1000 * extra_verify,
                                                             1000 * drafting, tokens - rows,
                                                             seconds * 1000))


bd.BatchTarget.forward_trees = forward_trees
bd.DraftWhilePays.record = record
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
run_ours(sm, prompts[: max(2, users // 4)], "auto", 8, max_batch=users)
for _ in range(runs):
    r = run_ours(sm, prompts, "auto", 128, max_batch=users)
    print(f"{sum(r['tokens']) / r['wall']:.1f} tok/s tau {r['tau']:.3f}", flush=True)
print("rows: plain rounds fwd ms | rounds with drafts: n, tokens, fwd ms, measured extra, charged extra, drafting ms; "
      "accepted drafts; whole round against plain")
for rows in sorted({r for r, _ in STATS}, reverse=True):
    p, d = STATS[rows, False], STATS[rows, True]
    if not p or not d:
        continue
    pf = sum(x[0] for x in p) / len(p)
    n = len(d)
    df, tok, ch, dr, acc, wall = (sum(x[i] for x in d) / n for i in range(6))
    pw = sum(x[5] for x in p) / len(p)
    print(f"{rows:>3}: {len(p):>4} {pf:7.2f} | {n:>4} {tok:5.1f} {df:7.2f} {df - pf:+7.2f} {ch:6.2f} {dr:6.2f}; "
          f"accepted {acc:.2f}/round; round {wall:.1f} ms vs plain {pw:.1f}: tokens/s x{(rows + acc) / wall * pw / rows:.3f}")
