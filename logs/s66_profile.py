"""Profile a batched run (diagnostic): python logs/s66_profile.py {auto,ar} U R -> the top functions by own time."""
import cProfile
import pstats
import sys

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

spec, users, R = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users * R)
run_ours(sm, prompts[:4], spec, 16)
prof = cProfile.Profile()
prof.enable()
r = run_ours(sm, prompts, spec, 128, max_batch=users)
prof.disable()
print(spec, users, R, sum(r["tokens"]), "tokens, tau", round(r["tau"], 2))
pstats.Stats(prof).sort_stats("tottime").print_stats(45)
