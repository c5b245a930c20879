"""EAGLE draft heads: module, checkpoint I/O and the heads shipped with the package."""

from __future__ import annotations

import warnings
from pathlib import Path

from drafttree.errors import DraftTreeError
from drafttree.heads.eagle3 import Eagle3Head
from drafttree.heads.loading import load_head, read_head_config
from drafttree.heads.model import EagleHead
from drafttree.heads.mtp import find_mtp

MTP = "mtp"  # --head mtp: the target's own MTP layer

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "heads"


def shipped_head_dir(target_name: str) -> Path | None:
    d = ASSETS / target_name
    return d if (d / "model.safetensors").exists() else None


def load_head_for(target, path: str | None = None, required: bool = False) -> EagleHead | Eagle3Head | None:
    """The head at ``path``; ``"mtp"``: the MTP layer in the target's own checkpoint; None: the head shipped for
    ``target``, else its checkpoint's MTP layer if it has one (None when neither exists)."""
    if path == MTP:
        own = checkpoint_dir(target)
        if own is None or find_mtp(own) is None:
            where = own or target.source or "in memory"
            raise DraftTreeError(f"--head mtp: the checkpoint of {target.name!r} ({where}) has no multi-token-"
                                 "prediction layer in its safetensors weights")
        return load_head(own, target)
    if path is None:
        d = shipped_head_dir(target.name)
        if d is None:
            try:
                own = checkpoint_dir(target)
                if own is not None and find_mtp(own) is not None:
                    return load_head(own, target)
            except DraftTreeError as e:  # the model decodes without it: say why, lose nothing
                warnings.warn(f"drafting without the checkpoint's MTP layer: {e}", stacklevel=2)
            if required:
                raise DraftTreeError(f"no EAGLE head ships for {target.name!r}; train one (drafttree train) "
                                     "and pass --head DIR")
            return None
        path = d
    return load_head(path, target)


def checkpoint_dir(target) -> Path | None:
    """The directory the target's weights came from: its own path, or a hub model's cached snapshot (never fetched)."""
    source = getattr(target, "source", "") or ""
    if not source:
        return None
    if Path(source).is_dir():
        return Path(source)
    try:
        from transformers.utils import cached_file

        config = cached_file(source, "config.json", local_files_only=True, _raise_exceptions_for_missing_entries=False)
    except Exception:  # not a hub id, or not in the cache
        return None
    return Path(config).parent if config else None


__all__ = ["Eagle3Head", "EagleHead", "load_head", "load_head_for", "read_head_config", "shipped_head_dir"]
