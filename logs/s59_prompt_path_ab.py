"""Diagnostic (stop 59): a prompt's prefill through the many-row path (prompt_products, this stop) against the path
its length used to pick (the small-GEMM kernel, one fused call per layer, up to 64 tokens), alternated in one process,
best of REPS. Usage: python logs/s59_prompt_path_ab.py [REPS]"""
import contextlib
import sys
import time

import torch

import drafttree
from drafttree.kernels import prompt_products

torch.set_num_threads(2)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 15
sm = drafttree.load(dtype="bfloat16")

words = "The quick brown fox jumps over the lazy dog near the river bank. " * 40
for n in (8, 24, 48, 64, 200):
    ids = sm.tokenizer(words, add_special_tokens=False, return_tensors="pt").input_ids[0, :n]
    best = {"many-row (new)": 1e9, "by length (old)": 1e9}
    for _ in range(reps):
        for label, ctx in (("many-row (new)", prompt_products), ("by length (old)", contextlib.nullcontext)):
            t = time.perf_counter()
            with ctx():
                sm._runner.prefill(ids)
            best[label] = min(best[label], time.perf_counter() - t)
    print(n, " ".join(f"{k} {v * 1e3:.2f} ms" for k, v in best.items()))
