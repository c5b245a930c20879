"""Grouped-query tree attention without K/V copies, through transformers' attention interface.

With an explicit 4-D mask (every tree verification), transformers' SDPA path repeats each K/V head for its
query heads (``repeat_kv``): a copy of the whole past K/V in every layer on every forward, a cost that grows
with the context. Here the query heads that share a K/V head are folded into the query length instead
(``[B, H, T, D] -> [B, H_kv, g*T, D]``, the mask repeated along it): the same products, K/V read in place.
Long queries (a prefill) and anything unusual (softcapping, position biases, no groups) go to the stock SDPA
function. Registered under :data:`NAME`; :func:`grouped_attention` switches a model to it for one call only,
so the same model object keeps transformers' own attention everywhere else (e.g. Hugging Face's generate).

A batch of rows (``batching/target.py``) runs as one packed sequence, every row's tree after the other (the
linear layers see each row's real nodes, not every row padded to the largest tree), and passes :func:`row_runs`:
runs of rows of similar length and tree size, each attended over its own prefix of the cache (views, no copies)
with its queries spread on a small padded grid, instead of every row over the longest row's slots.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "drafttree_grouped_sdpa"
MAX_FOLDED_QUERY = 128  # longer queries (prefills) use the stock path: a folded mask would cost more than K/V
_local = threading.local()


@dataclass
class RowRun:
    """Rows ``[first, end)`` of a batch whose trees sit packed at tokens ``[t0, t1)`` of the forward: they attend
    together over slots ``[0, slots)`` with their queries spread on a ``[rows, width]`` grid (``grid``: where each
    packed token goes in it; None when every row of the run has ``width`` nodes and the packing is the grid)."""

    first: int
    end: int
    slots: int
    width: int
    t0: int
    t1: int
    grid: torch.Tensor | None = None
    pad: torch.Tensor | None = None  # the grid's entries no token goes to


@contextlib.contextmanager
def row_runs(runs: list[RowRun]):
    """Inside the block, a forward of one packed sequence over a cache of ``runs[-1].end`` rows attends run by
    run: each row over its own slots only (its mask allows nothing beyond), queries padded to its run's width."""
    old = getattr(_local, "runs", None)
    _local.runs = runs
    try:
        yield
    finally:
        _local.runs = old


def _packed(module, query, key, value, attention_mask, runs: list[RowRun], **kwargs):
    q = query[0].transpose(0, 1)  # [T, H, D]
    out = q.new_empty(q.shape)
    H, D = q.shape[1:]
    for run in runs:
        rows, m = run.end - run.first, run.width
        part = q[run.t0:run.t1]
        if run.grid is None:
            grid = part.reshape(rows, m, H, D)
        else:
            grid = q.new_empty(rows * m, H, D)
            grid[run.pad] = 0  # padding queries: their outputs are dropped, but keep them finite
            grid[run.grid] = part
            grid = grid.view(rows, m, H, D)
        a, b, L = run.first, run.end, run.slots
        mask = None if attention_mask is None else attention_mask[a:b, :, :m, :L]
        res = _attend(module, grid.transpose(1, 2), key[a:b, :, :L], value[a:b, :, :L], mask, **kwargs)[0]
        res = res.reshape(rows * m, H, D)
        out[run.t0:run.t1] = res if run.grid is None else res[run.grid]
    return out.unsqueeze(0), None


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs):
    runs = getattr(_local, "runs", None)
    if runs and query.shape[0] == 1 and key.shape[0] == runs[-1].end and query.shape[2] == runs[-1].t1:
        return _packed(module, query, key, value, attention_mask, runs, dropout=dropout, scaling=scaling, **kwargs)
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
