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


def smollm2_weights(exts: dict, generator):
    """Random bf16 weights of SmolLM2-135M's 30 layers and LM head, in huge pages as a loaded model's, each packed by
    every build in ``exts`` that packs weights: (layers as dicts of q/k/v/o/gate/up/down, head)."""
    import torch

    from drafttree.kernels.memory import huge_page_copy

    H, I, KV, V = 576, 1536, 192, 49152

    def w(n, k):
        t = huge_page_copy((torch.randn(n, k, generator=generator) / k**0.5).bfloat16())
        for e in exts.values():
            if getattr(e, "packed", False) and e.packable(t):
                e.register_packed(t, huge_page_copy(e.pack_weight(t)))
        return t

    layers = [dict(q=w(H, H), k=w(KV, H), v=w(KV, H), o=w(H, H), gate=w(I, H), up=w(I, H), down=w(H, I))
              for _ in range(30)]
    return layers, w(V, H)
