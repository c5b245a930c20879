"""The 16-user burst's packed prefill (diagnostic): python logs/s71_prefill_rate.py

The concurrency benchmark's 16 prompts (interleaved from the six tasks), prefilled together into a fresh batch three
times: their token counts, seconds, tokens/s and the GFLOP/s of the weights' products alone (2 x 134.5M per token)."""
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

sm = drafttree.load(dtype="bfloat16")
ids = [sm.encode_prompt(p) for p in interleaved_prompts(list(BUILTIN), 16)]
n = sum(int(i.numel()) for i in ids)
print("prompt tokens", [int(i.numel()) for i in ids], n)
for _ in range(3):
    bt = sm.batch_target()
    t0 = time.perf_counter()
    bt.add_many(ids, [128] * len(ids))
    t = time.perf_counter() - t0
    print(f"packed prefill {t:.3f} s, {n / t:.0f} tok/s, {2 * 134.5e6 * n / t / 1e9:.0f} GFLOP/s (weights only)")
