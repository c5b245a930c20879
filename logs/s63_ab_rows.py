"""Lone trees of 1/2/4 tokens against batches of 1/2/4 single-token rows, alternated in one process (stop 63, a diagnostic). Usage: python logs/s63_ab_rows.py"""
import statistics, sys, time
import torch
import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
from drafttree.tree import DraftTree
torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
runner = sm._runner
runner.prefill(torch.randint(0, 49000, (256,)))
fs = {}
for n in (1, 2, 4):
    tok = torch.randint(0, 49000, (n,)); idx = torch.arange(n)
    fs[f"lone{n}"] = (lambda tok=tok, idx=idx: runner.forward_tree(tok, idx, idx[:, None] >= idx[None, :]))
bts = {}
for u in (1, 2, 4):
    from drafttree.batching import BatchTarget
    bt = BatchTarget(sm.target.model)
    ids = [sm.encode_prompt(p) for p in interleaved_prompts(list(BUILTIN), u)]
    bt.add_many(ids, [128] * u)
    trees = [DraftTree.chain(100, []) for _ in range(u)]
    bts[u] = bt
    fs[f"batch{u}"] = (lambda bt=bt, trees=trees: bt.forward_trees(trees))
for f in fs.values(): f(); f()
ts = {k: [] for k in fs}
for i in range(40):
    for k, f in fs.items():
        t0 = time.perf_counter(); f(); ts[k].append(time.perf_counter() - t0)
    runner.discard_pending()
for k, v in ts.items():
    print(k, "median %.2f ms  min %.2f" % (statistics.median(v) * 1e3, min(v) * 1e3))
