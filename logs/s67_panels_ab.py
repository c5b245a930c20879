"""AVX2 panels against the vector path in one process (diagnostic): python logs/s67_panels_ab.py [REPS].

The verify-cost curve's own timing (a forward over N chain tokens on a 256-token prefix, fastest of 2 x REPS), both
paths at every size in every pass (``set_panels`` switched around each forward), bf16, 2 threads."""
import contextlib
import sys

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.budget import _measure  # noqa: E402
from drafttree.kernels import gemm  # noqa: E402

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
sm = drafttree.load(dtype="bfloat16")
ext = gemm.small_gemm()


def mode(on: bool):
    @contextlib.contextmanager
    def switch():
        ext.set_panels(on)
        try:
            yield
        finally:
            ext.set_panels(True)
    return switch


curves = _measure(sm._runner, {"vector": mode(False), "panels": mode(True)}, 256, reps,
                  [1, 2, 4, 8, 16, 24, 32, 48, 64, 96], False)
print(f"{'tokens':>6} {'vector ms':>10} {'panels ms':>10} {'ratio':>6}")
for i, n in enumerate(curves["vector"].sizes):
    a, b = curves["vector"].seconds[i], curves["panels"].seconds[i]
    print(f"{n:>6} {1000 * a:>10.2f} {1000 * b:>10.2f} {b / a:>6.3f}")
