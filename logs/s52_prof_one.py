"""Stop 52 diagnostic: cProfile of auto's drafting (propose + observe) for one user's prompt, alone, T=0."""
import sys, cProfile, pstats, torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
sm = drafttree.load(dtype="bfloat16")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
prompts = interleaved_prompts(list(BUILTIN), n)
sm.generate(prompts[0], 16)
d = sm.drafter(None, None)
p = cProfile.Profile()
cls = type(d)
op, oo = cls.propose, cls.observe
def propose(self, req):
    p.enable(); r = op(self, req); p.disable(); return r
def observe(self, *a):
    p.enable(); r = oo(self, *a); p.disable(); return r
cls.propose, cls.observe = propose, observe
for pr in prompts:
    r = sm.generate(pr, 128)
    print(r.tokens_per_second, r.tau, r.stats.time_draft, r.stats.target_forwards)
pstats.Stats(p).sort_stats("cumulative").print_stats(r"drafttree|torch|numpy|builtin|method", 60)
