"""In-process A/B of prompt products on weights packed once for oneDNN (stop 63, a diagnostic): A =
DRAFTTREE_ONEDNN_CACHE_MB=0 (torch's F.linear, packing per call), B = packed copies kept; a packed prefill of USERS
users' first prompts and one prompt alone per size in SIZES, alternated, median of REPS. Checks the logits agree.
Usage: python logs/s63_onednn_ab.py [USERS] [REPS]"""
import os
import statistics
import sys
import time

import torch

import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
from drafttree.kernels import onednn

torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
users = int(sys.argv[1]) if len(sys.argv) > 1 else 16
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
ids = [sm.prompt_ids(p, True) for p in interleaved_prompts(list(BUILTIN), users)]
longest = max(ids, key=lambda x: x.numel())
bt = sm.batch_target()


def run(mode: str, prompts) -> tuple[float, torch.Tensor]:
    os.environ["DRAFTTREE_ONEDNN_CACHE_MB"] = "0" if mode == "A" else ""
    if mode == "A":
        onednn.clear()
    t0 = time.perf_counter()
    outs = bt.add_many(prompts, [128] * len(prompts))
    t = time.perf_counter() - t0
    bt.keep([])
    return t, torch.cat([o.logits for o in outs])


for case, prompts in ((f"{users} users packed ({sum(x.numel() for x in ids)} tokens)", ids),
                      (f"one prompt of {longest.numel()} tokens", [longest])):
    ref = {m: run(m, prompts)[1] for m in "AB"}
    ts = {"A": [], "B": []}
    for i in range(reps):
        for m in ("AB" if i % 2 == 0 else "BA"):
            ts[m].append(run(m, prompts)[0])
    a, b = statistics.median(ts["A"]), statistics.median(ts["B"])
    print(f"{case}: A {a:.3f} s  B {b:.3f} s  B/A {b / a:.3f}  same logits: {torch.equal(ref['A'], ref['B'])}")
print("packed path agrees with F.linear:", onednn._agrees)
