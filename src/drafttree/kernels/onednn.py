"""Many-row bf16 products (a prompt's) on weights packed once for oneDNN, instead of packed on every call.

torch's CPU ``F.linear`` in bf16 reorders the weight into oneDNN's blocked layout on every call; inductor's frozen
graphs pack it once (``mkldnn._reorder_linear_weight``) and call ``mkldnn._linear_pointwise``, the same primitive.
Here (2-core Zen 4, SmolLM2-135M's shapes, 65-4,096 rows) that is 3-17% faster per product and bitwise the same
result; the first product of a process is computed both ways and the path is kept only if the bits agree. Packed
copies are kept per weight (dropped with it, redone when it changes) up to ``DRAFTTREE_ONEDNN_CACHE_MB`` in all
(default 1024; 0 turns the path off): a weight that does not fit takes ``F.linear`` as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from drafttree.kernels import settings
from drafttree.kernels.kept import KeptCopies

CACHE_MB = 1024
# the row count oneDNN is told to pack for: one layout for every weight and row count (its bits were checked at 65-4,096
# rows with this layout)
PACK_ROWS = 1024
_agrees: bool | None = None  # the packed path gave F.linear's bits on the first product (None: not tried yet)


def cache_limit() -> int:
    """Bytes of packed weight copies kept (DRAFTTREE_ONEDNN_CACHE_MB, else CACHE_MB)."""
    return settings.megabytes("DRAFTTREE_ONEDNN_CACHE_MB", CACHE_MB)


_kept = KeptCopies(cache_limit)


def available() -> bool:
    return (_agrees is not False and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def clear() -> None:
    """Drop every packed copy (after editing weights in ways their version counter does not see)."""
    _kept.clear()


def _packed(w: torch.Tensor) -> torch.Tensor | None:
    """The kept packed copy of weight ``w``, made now if there is room; None where it cannot be kept."""
    hit = _kept.get(w)
    if hit is not None:
        return hit
    return _kept.put(w, w.numel() * w.element_size(),
                     lambda: torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS))


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``F.linear(x, w, bias)`` for bf16 CPU operands through a packed copy of ``w``; None where the path does not
    apply here (the caller runs ``F.linear``)."""
    global _agrees
    if not available() or w.dim() != 2 or not w.is_contiguous() or x.shape[-1] != w.shape[1] or x.dim() < 2:
        return None
    x2 = x.reshape(-1, x.shape[-1])
    try:  # packing too may fail: oneDNN's bf16 reorder needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT (not a Zen 3)
        packed = _packed(w)
        if packed is None:
            return None
        out = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), packed, bias, "none", [], "")
    except RuntimeError:
        _agrees = False
        clear()
        return None
    if _agrees is None:  # once: the same bits as torch's own product, or never again
        _agrees = bool(torch.equal(out, F.linear(x2, w, bias)))
        if not _agrees:
            clear()
            return None
    return out.view(*x.shape[:-1], w.shape[0])
