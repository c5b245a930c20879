"""Prefill of one prompt of N tokens (bf16, 2 threads) with the prompt-attention kernel and with torch's flash kernel,
alternated in one process, the fastest of REPS each (stop 58). Usage: python logs/s58_prefill_ab.py 769,2629,6000 3"""
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree import attention  # noqa: E402

sm = drafttree.load(dtype="bfloat16", show_progress=False)
runner, real = sm._runner, attention.kernel_for


class TorchOnly:  # the kernel object without the prompt kernel: prompts go to torch's SDPA
    prompt_attention_ready = False


def prefill(ids, kernel: bool) -> float:
    attention.kernel_for = real if kernel else (lambda d, t: TorchOnly())
    try:
        t0 = time.perf_counter()
        runner.prefill(ids)
        return time.perf_counter() - t0
    finally:
        attention.kernel_for = real


for n in (int(s) for s in sys.argv[1].split(",")):
    ids = torch.randint(100, 40000, (n,), generator=torch.Generator().manual_seed(n))
    prefill(ids, True), prefill(ids, False)
    best = {True: 1e9, False: 1e9}
    for _ in range(int(sys.argv[2])):
        for k in (True, False):
            best[k] = min(best[k], prefill(ids, k))
    print(f"{n:5d} tokens: torch's attention {best[False]:.3f} s, kernel {best[True]:.3f} s, "
          f"{best[False] / best[True]:.2f}x", flush=True)
