"""In-process A/B of a 16-user packed prefill (stop 63, a diagnostic): A = the stock MLP forward for many rows and a
new cache per burst (the code before), B = the activation in place and the emptied batch's buffers kept, C = the
activation in place alone; alternated,
median and min of REPS each. Usage: python logs/s63_prefill_ab.py [USERS] [REPS]"""
import functools
import statistics
import sys
import time

import torch

import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
from drafttree.kernels import layers

torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
users = int(sys.argv[1]) if len(sys.argv) > 1 else 16
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
ids = [sm.prompt_ids(p, True) for p in interleaved_prompts(list(BUILTIN), users)]
print("prompt tokens", sum(x.numel() for x in ids))
bt = sm.batch_target()
bt.add_many(ids[:2], [8, 8])  # installs the kernels' per-module forwards
bt.keep([])
mlps = [layer.mlp for layer in sm.target.model.model.layers]
new_fwd = [m.forward for m in mlps]


def old_mlp(module, biases, x):  # the code before: the stock forward for more than the kernel's rows
    if x.numel() <= layers.gemm.MAX_ROWS * x.shape[-1]:
        return layers._mlp_forward(module, biases, x)
    return type(module).forward(module, x)


old_fwd = [functools.partial(old_mlp, *f.args) for f in new_fwd]


def run(mode: str) -> float:
    if mode in "AC":  # C: the activation in place, a new cache per burst
        bt.forget_buffers()
    for m, f in zip(mlps, old_fwd if mode == "A" else new_fwd):
        m.forward = f
    t0 = time.perf_counter()
    bt.add_many(ids, [128] * len(ids))
    t = time.perf_counter() - t0
    bt.keep([])
    return t


for m in "ABCABC":
    run(m)
ts = {"A": [], "B": [], "C": []}
for i in range(reps):
    for m in ("ABC" if i % 2 == 0 else "CBA"):
        ts[m].append(run(m))
for m, v in ts.items():
    print(m, "median %.3f s  min %.3f s" % (statistics.median(v), min(v)))
print("B/A median %.3f, C/A %.3f" % tuple(statistics.median(ts[m]) / statistics.median(ts["A"]) for m in "BC"))
