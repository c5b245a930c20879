"""Where drafttree keeps files: one place, imported by whoever needs a cache location."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Converted models, assembled packs and calibration files (``$DRAFTTREE_CACHE``, else the XDG cache)."""
    root = os.environ.get("DRAFTTREE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "drafttree"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def calibration_dir() -> Path:
    return cache_dir() / "calibration"
