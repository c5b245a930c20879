"""A U-row round against a lone U-token tree, alternated in one process, with a profiler split (stop 63, a diagnostic). Usage: python logs/s63_round_vs_lone.py U [prof]"""
import statistics, sys, time
import torch
import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
from drafttree.tree import DraftTree
torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
u = int(sys.argv[1]) if len(sys.argv) > 1 else 16
bt = sm.batch_target(); bt.keep([])
ids = [sm.encode_prompt(p) for p in interleaved_prompts(list(BUILTIN), u)]
bt.add_many(ids, [128] * u)
trees = [DraftTree.chain(100, []) for _ in range(u)]
runner = sm._runner
runner.prefill(torch.randint(0, 49000, (256,)))
tok = torch.randint(0, 49000, (u,)); idx = torch.arange(u)
lone = lambda: runner.forward_tree(tok, idx, idx[:, None] >= idx[None, :])
batch = lambda: bt.forward_trees(trees)
for f in (lone, batch, lone, batch): f()
ts = {"lone": [], "batch": []}
for i in range(30):
    for name, f in (("lone", lone), ("batch", batch)):
        t0 = time.perf_counter(); f(); ts[name].append(time.perf_counter() - t0)
    runner.discard_pending()
for k, v in ts.items():
    print(k, "median %.2f ms  min %.2f" % (statistics.median(v) * 1e3, min(v) * 1e3))
if len(sys.argv) > 2:
    for name, f in (("lone", lone), ("batch", batch)):
        with torch.profiler.profile() as p:
            for _ in range(10): f()
        print(name); print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
