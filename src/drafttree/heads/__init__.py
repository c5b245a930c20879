"""EAGLE draft heads: module, checkpoint I/O and the heads shipped with the package."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

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


def check_draft_vocab(size) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise DraftTreeError(f"draft_vocab must be a positive number of token ids, got {size!r}")


def restrict_draft_vocab(head, size: int, target) -> None:
    """Draft over the first ``size`` token ids (and the special ones) instead of the whole vocabulary: a head that
    drafts with the target's LM head (a model's own MTP layer, an EAGLE-1 head) reads ``size`` of its rows per draft
    level instead of all of them. A byte-level BPE vocabulary lists its tokens in merge order, the frequent first (on
    held-out prompts the first 32,768 of Qwen2.5-Coder's 151,936 ids cover 92% of what it writes, and a random MTP
    layer's level costs 2.2 instead of 10.3 ms against 24.7 ms per plain token: logs/s79_mtp_vocab_cost.log,
    logs/s79_vocab_coverage.log). Tokens left out are never
    drafted; the target still writes them (drafting changes speed, never the output)."""
    check_draft_vocab(size)
    if head is None:
        raise DraftTreeError("draft_vocab restricts the drafts of an EAGLE head or MTP layer, and none drafts here: "
                             "leave out --draft-vocab, or use a method and --head that draft with one")
    if not hasattr(head, "set_draft_vocab") or getattr(head, "draft_vocab", None) is not None:
        has = getattr(head, "draft_vocab", None)
        what = f"its own draft vocabulary of {len(has)} tokens" if has is not None else "an LM head of its own"
        raise DraftTreeError(f"draft_vocab: this {type(head).__name__} drafts with {what}; only heads that draft "
                             "with the target's LM head (an MTP layer, an EAGLE-1 head) take a smaller one")
    vocab = int(head.lm_head.weight.shape[0])
    if size > vocab:
        raise DraftTreeError(f"draft_vocab {size} is more than the target's {vocab} tokens")
    special = set(getattr(target.tokenizer, "all_special_ids", None) or []) | target.eos_token_ids()
    ids = sorted(set(range(size)) | {int(i) for i in special if 0 <= int(i) < vocab})
    head.set_draft_vocab(torch.tensor(ids, dtype=torch.long))


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


__all__ = ["Eagle3Head", "EagleHead", "load_head", "load_head_for", "read_head_config", "restrict_draft_vocab",
           "shipped_head_dir"]
