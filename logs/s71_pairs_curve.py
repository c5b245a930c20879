"""The target's forward per token count with bf16 products on panels of K pairs and on the vector path (diagnostic):
python logs/s71_pairs_curve.py [REPS]

The default model in bf16, 2 threads, chains of N tokens on a 256-token prefix (budget._measure: the fastest of 2 x
REPS, the two modes interleaved at every size); the packed weights as a load puts them (huge pages). Needs
logs/s71_pair_panels.patch applied (``git apply``): the pair panels were not shipped."""
import contextlib
import sys

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.budget import _measure  # noqa: E402
from drafttree.kernels import gemm  # noqa: E402

ext = gemm.small_gemm()
sm = drafttree.load(dtype="bfloat16")
print("kernel", gemm.kernel_status(), "panels on at load:", gemm.panels_on(), "pairs:", getattr(ext, "panel_pairs", 0))


@contextlib.contextmanager
def panels(on: bool):
    before = ext.panels_on()
    ext.set_panels(on)
    try:
        yield
    finally:
        ext.set_panels(before)


reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
sizes = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]
curves = _measure(sm._runner, {"vector": lambda: panels(False), "pairs": lambda: panels(True)}, 256, reps, sizes,
                  False)
for n in sizes:
    v, p = curves["vector"].verify(n), curves["pairs"].verify(n)
    print(f"{n:3d} tokens: vector {v * 1e3:6.2f} ms  pairs {p * 1e3:6.2f} ms  pairs/vector {p / v:.3f}")
