"""Grouped-query tree attention without K/V copies, through transformers' attention interface.

With an explicit 4-D mask (every tree verification), transformers' SDPA path repeats each K/V head for its
query heads (``repeat_kv``): a copy of the whole past K/V in every layer on every forward, a cost that grows
with the context. Here the query heads that share a K/V head are folded into the query length instead
(``[B, H, T, D] -> [B, H_kv, g*T, D]``, the mask repeated along it): the same products, K/V read in place.
Long queries (a prefill) and anything unusual (softcapping, position biases, no groups) go to the stock SDPA
function. Registered under :data:`NAME`; :func:`grouped_attention` switches a model to it for one call only,
so the same model object keeps transformers' own attention everywhere else (e.g. Hugging Face's generate).

A batch of rows with different lengths (``batching/target.py``) also passes :func:`row_segments`: runs of rows
whose keys end near the same slot, each attended over its own prefix of the cache (views, no copies) instead of
every row over the longest row's slots.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "drafttree_grouped_sdpa"
MAX_FOLDED_QUERY = 128  # longer queries (prefills) use the stock path: a folded mask would cost more than K/V
_local = threading.local()


@contextlib.contextmanager
def row_segments(segments: list[tuple[int, int, int]]):
    """Inside the block, batched attention runs per segment ``(first row, end row, key slots)``: rows
    ``[a, b)`` attend over slots ``[0, L)`` only (their masks allow nothing beyond)."""
    old = getattr(_local, "segments", None)
    _local.segments = segments
    try:
        yield
    finally:
        _local.segments = old


def _segmented(module, query, key, value, attention_mask, segments, **kwargs):
    outs = []
    for a, b, L in segments:
        mask = None if attention_mask is None else attention_mask[a:b, ..., :L]
        outs.append(_attend(module, query[a:b], key[a:b, :, :L], value[a:b, :, :L], mask, **kwargs)[0])
    return torch.cat(outs), None


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs):
    segments = getattr(_local, "segments", None)
    if segments and len(segments) > 1 and segments[-1][1] == query.shape[0] and query.shape[2] <= MAX_FOLDED_QUERY:
        return _segmented(module, query, key, value, attention_mask, segments, dropout=dropout, scaling=scaling,
                          **kwargs)
    return _attend(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _attend(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    groups = getattr(module, "num_key_value_groups", 1)
    B, H, T, D = query.shape
    # T == 1 with a mask is a batch's plain round: folding keeps it free of copies too
    if (groups == 1 or T > MAX_FOLDED_QUERY or attention_mask is None or dropout
            or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
            or key.shape[1] * groups != H or attention_mask.shape[1] != 1):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    hkv, L = key.shape[1], key.shape[2]
    q = query.reshape(B, hkv, groups * T, D)  # query head h = kv * groups + g, as repeat_kv pairs them
    mask = attention_mask[:, :, :, :L]
    if mask.dtype == torch.bool:
        mask = torch.zeros_like(mask, dtype=query.dtype).masked_fill_(~mask, torch.finfo(query.dtype).min)
    mask = mask.unsqueeze(2).expand(mask.shape[0], mask.shape[1], groups, T, L).reshape(mask.shape[0], mask.shape[1],
                                                                                         groups * T, L)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(B, H, T, D).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, grouped_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def grouped_attention(model: torch.nn.Module):
    """Run ``model`` with :func:`grouped_sdpa` inside the block (only if it was using SDPA)."""
    config = model.config
    old = getattr(config, "_attn_implementation", None)
    if old != "sdpa":
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = old
