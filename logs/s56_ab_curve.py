"""In-process A/B of two kernel builds on the verify-cost curve: budget._measure with gemm._ext swapped per mode."""
import contextlib, importlib.util, sys, torch
import drafttree
from drafttree import budget
from drafttree.kernels import gemm
torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
gemm.small_gemm()
def load(path, tag):
    spec = importlib.util.spec_from_file_location("k" + tag + ".drafttree_small_gemm", path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); return mod
base = "/root/.cache/drafttree/kernels/"
exts = {n: load(base + d + "/drafttree_small_gemm.so", n) for n, d in (("A", sys.argv[1]), ("B", sys.argv[2]))}
def mode(e):
    @contextlib.contextmanager
    def m():
        old = gemm._ext; gemm._ext = e
        try: yield
        finally: gemm._ext = old
    return m
sizes = [int(s) for s in sys.argv[3].split(",")]
curves = budget._measure(sm._runner, {k: mode(e) for k, e in exts.items()}, 256, int(sys.argv[4]), sizes, False)
for n in sizes:
    a, b = curves["A"].verify(n) * 1e3, curves["B"].verify(n) * 1e3
    print(f"{n:3d} tokens: A {a:6.2f} ms  B {b:6.2f} ms  B/A {b/a:.3f}")
