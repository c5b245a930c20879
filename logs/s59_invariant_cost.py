"""Diagnostic (stop 59): what batch invariance costs a burst of N users (auto, 128 tokens, the concurrency bench's
prompts), on and off alternated in one process, REPS each. Usage: python logs/s59_invariant_cost.py [N] [REPS]"""
import sys

import torch

import drafttree
from drafttree.bench.concurrency import interleaved_prompts, run_ours
from drafttree.bench.tasks import BUILTIN

torch.set_num_threads(2)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), n)
run_ours(sm, prompts[:4], "auto", 16)
got = {True: [], False: []}
for r in range(reps):
    for on in ((True, False) if r % 2 == 0 else (False, True)):
        sm.batch_target().batch_invariant = on
        res = run_ours(sm, prompts, "auto", 128)
        got[on].append(sum(res["tokens"]) / res["wall"])
for on, tps in got.items():
    print(f"batch_invariant={on}: " + ", ".join(f"{t:.1f}" for t in tps) + " tok/s")
