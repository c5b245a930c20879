"""In-process A/B of two kernel builds on a batch's rounds (stop 56): U rows prefilled from the six tasks' first turns,
then forwards of every row's tree (the root alone, or a chain of C tokens), alternating gemm._ext between the builds
(median of REPS each). Usage: python logs/s56_ab_batch.py BUILD_A BUILD_B USERS[,USERS] [CHAIN] [REPS]
(builds: directory names under ~/.cache/drafttree/kernels, e.g. from logs/s56_ab_curve.py's notes)."""
import statistics
import sys
import time

import torch
from ab_builds import load_build

import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
from drafttree.kernels import gemm
from drafttree.tree import DraftTree

torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
gemm.small_gemm()


exts = {"A": load_build(sys.argv[1], "A"), "B": load_build(sys.argv[2], "B")}
for ext in exts.values():  # each build packs the weights it packs (stop 57: else the first one used decides for both)
    gemm._ext = ext
    gemm.pack_tiles(sm._runner.model)
users = [int(u) for u in sys.argv[3].split(",")]
chain = int(sys.argv[4]) if len(sys.argv) > 4 else 1
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 21
for u in users:
    bt = sm.batch_target()
    bt.keep([])
    ids = [sm.encode_prompt(p) for p in interleaved_prompts(list(BUILTIN), u)]
    bt.add_many(ids, [128] * u)
    trees = [DraftTree.chain(100, list(range(200, 200 + chain - 1))) for _ in range(u)]
    ts = {"A": [], "B": []}
    for name in ("A", "B"):
        gemm._ext = exts[name]
        bt.forward_trees(trees)
    for i in range(reps):
        for name in (("A", "B") if i % 2 == 0 else ("B", "A")):
            gemm._ext = exts[name]
            t0 = time.perf_counter()
            bt.forward_trees(trees)
            ts[name].append(time.perf_counter() - t0)
    a, b = statistics.median(ts["A"]) * 1e3, statistics.median(ts["B"]) * 1e3
    print(f"{u:3d} rows x {chain} tokens: A {a:6.2f} ms  B {b:6.2f} ms  B/A {b / a:.3f}", flush=True)
