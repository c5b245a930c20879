"""In-process A/B of two builds of the kernel extension on the verify-cost curve (stop 56): the calibration's own
timing (budget._measure) with gemm._ext swapped between the builds pass by pass, the fastest of REPS passes each.
Builds are directory names under ~/.cache/drafttree/kernels (a source tree's build: its first use builds it there).
Usage: python logs/s56_ab_curve.py BUILD_A BUILD_B SIZES REPS, e.g. ... 1,4,8,16,32,64 9"""
import contextlib
import sys

import torch
from ab_builds import load_build

import drafttree
from drafttree import budget
from drafttree.kernels import gemm

torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
gemm.small_gemm()


def using(ext):
    @contextlib.contextmanager
    def mode():
        old, gemm._ext = gemm._ext, ext
        try:
            yield
        finally:
            gemm._ext = old
    return mode


exts = {"A": load_build(sys.argv[1], "A"), "B": load_build(sys.argv[2], "B")}
for ext in exts.values():  # each build packs the weights it packs (stop 57: else the first one used decides for both)
    with using(ext)():
        gemm.pack_tiles(sm._runner.model)
sizes = [int(s) for s in sys.argv[3].split(",")]
curves = budget._measure(sm._runner, {k: using(e) for k, e in exts.items()}, 256, int(sys.argv[4]), sizes, False)
for n in sizes:
    a, b = curves["A"].verify(n) * 1e3, curves["B"].verify(n) * 1e3
    print(f"{n:3d} tokens: A {a:6.2f} ms  B {b:6.2f} ms  B/A {b / a:.3f}")
