"""One prompt's prefill by length (stop 73, a diagnostic): the seconds, tokens/s and GFLOP/s of the weights' products
(2 x 106.2M per token: SmolLM2-135M's layers, no embedding or LM head) of a lone prompt of N tokens, best of R.
Usage: python logs/s73_prefill_lengths.py R N..."""
import sys
import time

import torch

import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN

torch.set_num_threads(2)
reps, lengths = int(sys.argv[1]), [int(x) for x in sys.argv[2:]]
sm = drafttree.load(dtype="bfloat16")
text = " ".join(interleaved_prompts(list(BUILTIN), 12))
ids = sm.tokenizer(text, return_tensors="pt").input_ids[0]
print(f"# python logs/s73_prefill_lengths.py {' '.join(sys.argv[1:])}")
with torch.inference_mode():
    for n in lengths:
        x = ids[:n].clone()
        best = 1e9
        for _ in range(reps):
            bt = sm.batch_target()
            t0 = time.perf_counter()
            bt.add(x, 8)
            best = min(best, time.perf_counter() - t0)
        rate = 2 * 106.2e6 * n / best / 1e9
        print(f"{n:5d} tokens: {best * 1e3:8.2f} ms  {n / best:7.0f} tok/s  {rate:5.0f} GFLOP/s")
