"""The decoder stack's loop (kernels/model_loop.py) against transformers' model forward, in one process, alternated
(diagnostic, not the benchmark): a lone sequence's tree forwards of N tokens and a batch's round of R single-token
rows, the fastest of 30 forwards per pass, the median over passes. Usage: python logs/s60_model_loop_ab.py [passes]"""
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
import drafttree.target as T  # noqa: E402
from drafttree.batching import BatchTarget  # noqa: E402
from drafttree.kernels import model_loop  # noqa: E402
from drafttree.tree import DraftTree  # noqa: E402

passes = int(sys.argv[1]) if len(sys.argv) > 1 else 10
sm = drafttree.load(dtype="bfloat16")
real = model_loop.model_forward
prompt = sm.encode_prompt("Write a long story about a dragon who learns to code.")
lone = T.TargetModel(sm.target.model)
lone.prefill(prompt)
batch = BatchTarget(sm.target.model)
for i in range(16):
    batch.add(sm.encode_prompt(f"Question {i}: what is {i} + {i}?"))


def lone_step(n):
    toks, depths, anc = torch.arange(100, 100 + n), torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril()
    t = time.perf_counter()
    lone.forward_tree(toks, depths, anc)
    return time.perf_counter() - t


def batch_step(_):
    trees = [DraftTree.root_only(200 + r) for r in range(16)]
    t = time.perf_counter()
    batch.forward_trees(trees)
    spent = time.perf_counter() - t
    batch._truncate()  # nothing committed: the round's slots dropped
    return spent


cases = [("lone", n, lone_step) for n in (1, 4, 8, 16)] + [("batch of 16 rows", 1, batch_step)]
for name, n, step in cases:
    res = {True: [], False: []}
    for rep in range(passes):
        for on in ((True, False) if rep % 2 == 0 else (False, True)):
            T.model_forward = real if on else (lambda *a: None)
            res[on].append(min(step(n) for _ in range(30)))
    a, b = statistics.median(res[True]), statistics.median(res[False])
    print(f"{name:18s} {n:2d} tokens: loop {1000 * a:6.2f} ms, transformers' forward {1000 * b:6.2f} ms ({a / b:.3f}x)")
T.model_forward = real
