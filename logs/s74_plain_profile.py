"""Where auto's plain batched rounds spend more than ar's (stop 74, a diagnostic):
python logs/s74_plain_profile.py U R

A steady load of U users x R requests with every batched round plain (the policy never drafts), auto then ar,
under cProfile; prints the top functions by own time for each."""
import cProfile
import pstats
import sys

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching.policy import AlwaysDraft  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402


class NeverDraft(AlwaysDraft):
    def choose(self, rows, kind="", tail=False):
        return rows == 1


users, per = int(sys.argv[1]), int(sys.argv[2])
sm = drafttree.load(dtype="bfloat16")
sm.batch_policy = NeverDraft()
prompts = interleaved_prompts(list(BUILTIN), users * per)
for m in ("auto", "ar"):
    run_ours(sm, prompts[:users], m, 16, max_batch=users)
print(f"# python logs/s74_plain_profile.py {' '.join(sys.argv[1:])}")
for m in ("auto", "ar"):
    prof = cProfile.Profile()
    prof.enable()
    run_ours(sm, prompts, m, 128, max_batch=users)
    prof.disable()
    print(f"## {m}")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
