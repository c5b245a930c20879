"""Grouped-query tree attention without K/V copies, through transformers' attention interface.

With an explicit 4-D mask (every tree verification), transformers' SDPA path repeats each K/V head for its
query heads (``repeat_kv``): a copy of the whole past K/V in every layer on every forward, a cost that grows
with the context. Here the query heads that share a K/V head are folded into the query length instead
(``[B, H, T, D] -> [B, H_kv, g*T, D]``, the mask repeated along it): the same products, K/V read in place.
Long queries (a prefill) and anything unusual (softcapping, position biases, no groups) go to the stock SDPA
function. Registered under :data:`NAME`; :func:`grouped_attention` switches a model to it for one call only,
so the same model object keeps transformers' own attention everywhere else (e.g. Hugging Face's generate).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "drafttree_grouped_sdpa"
MAX_FOLDED_QUERY = 128  # longer queries (prefills) use the stock path: a folded mask would cost more than K/V


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs):
    groups = getattr(module, "num_key_value_groups", 1)
    B, H, T, D = query.shape
    if (groups == 1 or T == 1 or T > MAX_FOLDED_QUERY or attention_mask is None or dropout
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
