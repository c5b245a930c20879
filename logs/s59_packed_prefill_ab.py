"""Diagnostic (stop 59): a packed prefill of the first N interleaved benchmark prompts (the concurrency bench's), short
prompts' rows on the small-GEMM kernel (gemm.kernel_rows, this stop) against every row on the many-row path (as
before), alternated in one process, best of REPS. Usage: python logs/s59_packed_prefill_ab.py [N] [REPS]"""
import sys
import time

import torch

import drafttree
import drafttree.batching.target as bt_mod
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN

torch.set_num_threads(2)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
sm = drafttree.load(dtype="bfloat16")
ids = [sm.encode_prompt(p) for p in interleaved_prompts(list(BUILTIN), n)]
short = sum(x.numel() <= 64 for x in ids)
print(f"{n} prompts, {sum(x.numel() for x in ids)} tokens, {short} of them of <= 64 tokens")
best = {"split (new)": 1e9, "many-row (old)": 1e9}
for _ in range(reps):
    for label, on in (("split (new)", True), ("many-row (old)", False)):
        b = bt_mod.BatchTarget(sm.target.model, batch_invariant=on)
        t = time.perf_counter()
        b.add_many(ids, [128] * n)
        best[label] = min(best[label], time.perf_counter() - t)
print(" ".join(f"{k} {v:.3f} s" for k, v in best.items()))
