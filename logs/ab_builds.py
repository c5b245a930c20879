"""A kernel build loaded by its cache directory, for the in-process A/B harnesses (logs/s56_ab_*.py,
logs/s57_ab_products.py): two builds load as two modules under distinct names, not the first one again."""
import importlib.util

from drafttree.paths import cache_dir


def load_build(build: str, tag: str):
    """The extension built in ~/.cache/drafttree/kernels/BUILD, as module k<TAG>.drafttree_small_gemm."""
    path = cache_dir() / "kernels" / build / "drafttree_small_gemm.so"
    spec = importlib.util.spec_from_file_location("k" + tag + ".drafttree_small_gemm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
