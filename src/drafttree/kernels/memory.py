"""A CPU model's weights in transparent huge pages.

Decoding streams every weight once per forward, and on the CPU that stream runs at the speed of the hardware
prefetchers, which stop at every page boundary: with the 4 KiB pages a tensor normally gets (Linux's default THP
mode is ``madvise``: no huge pages unless asked for), a one-row product over a copy of SmolLM2-135M's LM head read
31-47 GB/s on a 2-core Zen 4, the same in 2 MiB pages 63 GB/s; inside the model, a one-token step 17.8 -> 15.8 ms.
:func:`move_to_huge_pages` copies a model's parameters into one anonymous mapping advised ``MADV_HUGEPAGE`` and
points each parameter at its slice (values and dtypes unchanged, so every result stays bit for bit the same). It is a
no-op off Linux, for non-CPU tensors, with ``DRAFTTREE_HUGE_PAGES=0``, or where THP is switched off (then the copy
would buy nothing).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
ALIGN = 64  # each tensor starts on a cache line


def huge_pages_available() -> bool:
    """Whether this process can ask for transparent huge pages (Linux, THP not ``never``, not switched off)."""
    if os.environ.get("DRAFTTREE_HUGE_PAGES", "1").strip().lower() in ("0", "off", "false", "no"):
        return False
    if not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        return False
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    return "[never]" not in mode


def move_to_huge_pages(module: torch.nn.Module) -> int:
    """Copy ``module``'s CPU parameters into huge-page memory (tied parameters stay tied); returns the bytes moved."""
    params = [p for p in dict.fromkeys(module.parameters()) if p.device.type == "cpu" and p.numel() > 0]
    if not params:
        return 0
    offsets, total = [], 0
    for p in params:
        offsets.append(total)
        total += -(-p.numel() * p.element_size() // ALIGN) * ALIGN
    raw = huge_page_bytes(total)
    if raw is None:
        return 0
    with torch.no_grad():
        for p, off in zip(params, offsets, strict=True):
            nbytes = p.numel() * p.element_size()
            view = raw[off:off + nbytes].view(p.dtype).view(p.shape)
            view.copy_(p.data)
            p.data = view
    return total


def huge_page_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of CPU tensor ``t`` in huge-page memory (``t`` itself where huge pages cannot be had)."""
    if t.device.type != "cpu" or t.numel() == 0:
        return t
    raw = huge_page_bytes(t.numel() * t.element_size())
    if raw is None:
        return t
    return raw.view(t.dtype).view(t.shape).copy_(t)


def huge_page_bytes(nbytes: int) -> torch.Tensor | None:
    """``nbytes`` of uint8 in memory advised ``MADV_HUGEPAGE``, starting on a huge-page boundary (None where huge
    pages cannot be had). The mapping lives as long as any tensor viewing it (``torch.frombuffer`` holds it)."""
    if not huge_pages_available():
        return None
    try:
        region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        region.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return None
    raw = torch.frombuffer(region, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start:start + nbytes]
