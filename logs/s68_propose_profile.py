"""Where a batched round's drafting time goes (diagnostic): python logs/s68_propose_profile.py U.

Every round drafts (AlwaysDraft) over a burst of U users; cProfile runs only inside the head pass, each row's
propose and the pack, and prints the top functions by cumulative time."""
import cProfile
import pstats
import sys

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import decode as bd  # noqa: E402
from drafttree.batching.policy import AlwaysDraft  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users = int(sys.argv[1])
prof = cProfile.Profile()
N = {"rows": 0, "rounds": 0}


def profiled(cls, name):
    orig = getattr(cls, name)

    def wrapper(self, *a, **k):
        prof.enable()
        try:
            return orig(self, *a, **k)
        finally:
            prof.disable()
    setattr(cls, name, wrapper)


sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
run_ours(sm, prompts[:4], "auto", 8)
sm.batch_policy = AlwaysDraft()
orig_pack = bd.BatchDecoder._pack
profiled(bd.BatchDecoder, "_head_pass")
profiled(bd.BatchDecoder, "_pack")
orig_step = bd.BatchDecoder.step


def step(self):
    N["rows"] += self.rows
    N["rounds"] += 1
    return orig_step(self)


bd.BatchDecoder.step = step
from drafttree.drafters import hybrid  # noqa: E402

profiled(hybrid.HybridDrafter, "propose")
r = run_ours(sm, prompts, "auto", 128, max_batch=users)
print(f"{N['rounds']} rounds, {N['rows']} row-rounds, tau {r['tau']:.3f}")
st = pstats.Stats(prof)
print(f"profiled total {st.total_tt:.2f} s = {1000 * st.total_tt / N['rows']:.3f} ms per row-round")
st.sort_stats("cumulative").print_stats(40)
