"""EAGLE draft heads: module, checkpoint I/O and the heads shipped with the package."""

from __future__ import annotations

from pathlib import Path

from drafttree.errors import DraftTreeError
from drafttree.heads.eagle3 import Eagle3Head
from drafttree.heads.loading import load_head, read_head_config
from drafttree.heads.model import EagleHead

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "heads"


def shipped_head_dir(target_name: str) -> Path | None:
    d = ASSETS / target_name
    return d if (d / "model.safetensors").exists() else None


def load_head_for(target, path: str | None = None, required: bool = False) -> EagleHead | Eagle3Head | None:
    """The head at ``path``, or the one shipped for ``target`` when ``path`` is None (None if none ships)."""
    if path is None:
        d = shipped_head_dir(target.name)
        if d is None:
            if required:
                raise DraftTreeError(f"no EAGLE head ships for {target.name!r}; train one (drafttree train) "
                                     "and pass --head DIR")
            return None
        path = d
    return load_head(path, target)


__all__ = ["Eagle3Head", "EagleHead", "load_head", "load_head_for", "read_head_config", "shipped_head_dir"]
