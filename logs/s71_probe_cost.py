"""What a burst's probe rounds cost (diagnostic): python logs/s71_probe_cost.py U

Three bursts of U users x 128 tokens under one DraftWhilePays policy (kept across bursts, as a server keeps it); per
burst, of its rounds with at least U/2 rows: how many drafted, a plain and a drafting round's mean milliseconds, the
drafting round's proposals (``drafting``) and drafted tokens' modelled share of the forward (``extra verify``), and
its accepted drafts over the rows' roots."""
import statistics as st
import sys

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching.policy import DraftWhilePays  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users = int(sys.argv[1])
sm = drafttree.load(dtype="bfloat16")
pol = sm.batch_policy = DraftWhilePays()
prompts = interleaved_prompts(list(BUILTIN), users)
rec = []
real = pol.record


def record(rows, drafted, tokens, seconds, measured=True, drafting=0.0, extra_verify=0.0, kind="",
           tail_drafts=None, row_seconds=0.0):
    rec.append((rows, drafted, tokens, seconds, drafting, extra_verify, tail_drafts, row_seconds))
    return real(rows, drafted, tokens, seconds, measured, drafting, extra_verify, kind, tail_drafts, row_seconds)


pol.record = record


def mean_ms(xs):
    xs = list(xs)
    return st.mean(xs) * 1e3 if xs else 0.0


for b in range(3):
    rec.clear()
    run_ours(sm, prompts, "auto", 128, max_batch=users)
    d = [x for x in rec if x[1] and x[0] >= users // 2]
    p = [x for x in rec if not x[1] and x[0] >= users // 2]
    print(f"burst {b}: {len(d)} drafting rounds, {len(p)} plain; plain round {mean_ms(x[3] for x in p):.1f} ms; "
          f"drafting round {mean_ms(x[3] for x in d):.1f} ms (drafting {mean_ms(x[4] for x in d):.1f}, "
          f"extra verify {mean_ms(x[5] for x in d):.1f}); accepted drafts a drafting round "
          f"{st.mean(x[2] - x[0] for x in d) if d else 0:.2f}, the tail row's {st.mean(x[6] for x in d) if d else 0:.2f}; "
          f"row_seconds {mean_ms(x[7] for x in rec if x[0] > 1):.2f} ms", flush=True)
print("policy:", pol.summary())
