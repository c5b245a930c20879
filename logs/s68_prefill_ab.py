"""A prompt's prefill with AVX2 panels against the path without them, alternated in one process (diagnostic):
python logs/s68_prefill_ab.py [REPS] -> per prompt length, the fastest of REPS prefills each way (bf16, 2 threads)."""
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import BatchTarget  # noqa: E402
from drafttree.kernels import gemm  # noqa: E402

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
sm = drafttree.load(dtype="bfloat16")
ext = gemm.small_gemm()
model = sm.target.model
g = torch.Generator().manual_seed(0)
print(f"{'tokens':>6} {'other ms':>9} {'panels ms':>10} {'ratio':>6}")
for n in (65, 128, 256, 512):
    p = torch.randint(100, 40000, (n,), generator=g)
    best = {True: float("inf"), False: float("inf")}
    for r in range(2 * reps + 2):
        on = r % 2 == 0
        ext.set_panels(on)
        t0 = time.perf_counter()
        BatchTarget(model).add_many([p], [4])
        dt = time.perf_counter() - t0
        if r >= 2:  # the first of each way: warm-up
            best[on] = min(best[on], dt)
    ext.set_panels(True)
    print(f"{n:>6} {1000 * best[False]:>9.1f} {1000 * best[True]:>10.1f} {best[True] / best[False]:>6.3f}", flush=True)
