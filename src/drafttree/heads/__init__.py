"""EAGLE draft heads: module, checkpoint I/O and the heads shipped with the package."""

from __future__ import annotations

from drafttree.errors import DraftTreeError


def load_head_for(target, path=None, required: bool = False):
    """The head at ``path``, or the one shipped for ``target`` when ``path`` is None (None if none ships)."""
    if required:
        raise DraftTreeError(f"no EAGLE head available for {target.name!r}")
    return None
