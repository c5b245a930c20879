"""Rounds of U rows (one token each, prompts from the six tasks) for S seconds: ms per round (stop 64, a diagnostic; run it alternately with two versions of the kernel sources in place, the build is cached per source hash). Usage: python logs/s64_round.py U S"""
import sys, time, torch, drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
from drafttree.tree import DraftTree
torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
u = int(sys.argv[1])
bt = sm.batch_target(); bt.keep([])
ids = [sm.encode_prompt(p) for p in interleaved_prompts(list(BUILTIN), u)]
bt.add_many(ids, [128] * u)
trees = [DraftTree.chain(100, []) for _ in range(u)]
for _ in range(3): bt.forward_trees(trees)
t0=time.perf_counter(); n=0
while time.perf_counter()-t0 < float(sys.argv[2]):
    bt.forward_trees(trees); n+=1
print("rounds", n, "ms/round", (time.perf_counter()-t0)/n*1e3)
