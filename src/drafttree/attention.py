"""Grouped-query tree attention without K/V copies, through transformers' attention interface.

With an explicit 4-D mask (every tree verification), transformers' SDPA path repeats each K/V head for its
query heads (``repeat_kv``): a copy of the whole past K/V in every layer on every forward, a cost that grows
with the context. Here the query heads that share a K/V head are folded into the query length instead
(``[B, H, T, D] -> [B, H_kv, g*T, D]``, the mask repeated along it): the same products, K/V read in place.
Long queries (a prefill) and anything unusual (softcapping, position biases, no groups) go to the stock SDPA
function. Registered under :data:`NAME`; :func:`grouped_attention` switches a model to it for one call only,
so the same model object keeps transformers' own attention everywhere else (e.g. Hugging Face's generate).

On the CPU, every such call (a tree, a batch of trees, a plain step with a mask) runs the decode-attention kernel
(``kernels/tree_attention.cpp``): queries packed, each over its own row's keys and only those its mask allows, the
query heads of a group reading their K/V head in place, one call per layer. torch's flash kernel is built for long
queries and cost ~0.1-0.3 ms per call of a few; the kernel is also row-invariant (a row's outputs do not depend on
the rows beside it). Elsewhere (GPUs, no compiler, ``DRAFTTREE_KERNELS=0``) a batch of rows (``batching/target.py``)
runs as one packed sequence through :func:`row_runs`: runs of rows of similar length and tree size, each attended over
its own prefix of the cache (views, no copies) with its queries spread on a small padded grid.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from drafttree import kernels
from drafttree.errors import DraftTreeError
from drafttree.kernels.gemm import NO_INDEX

NAME = "drafttree_grouped_sdpa"
NAME_EAGER = "drafttree_rows_eager"
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


@dataclass
class PackedRows:
    """A forward of one packed sequence over a cache of ``rows`` rows: token t is node ``node[t]`` of row ``row[t]``
    (its row of the mask), and row r attends over its first ``key_len[r]`` slots."""

    rows: int
    tokens: int
    row: torch.Tensor
    node: torch.Tensor
    key_len: torch.Tensor


@dataclass
class PromptRows:
    """Several prompts prefilled in one forward of one packed sequence: prompt r is tokens ``[starts[r],
    starts[r + 1])`` and row r of the cache; each attends causally over its own keys only, exactly as a prefill
    of that prompt alone attends (the same SDPA call on the same rows), while the linear layers see every
    prompt's tokens at once (a product of many rows runs near the GEMM's peak, one of a short prompt far below)."""

    starts: list[int]
    first: int = 0  # the cache row of the first prompt (a batch's newcomers join after its rows)
    # each prompt's keys (its whole length) where the forward holds only its rest: the first ``keys[r] - (starts[r + 1]
    # - starts[r])`` were copied into its row from a prompt that begins the same way (BatchTarget: shared prefixes)
    keys: list[int] | None = None


def kernel_for(device: torch.device, dtype: torch.dtype):
    """The decode-attention kernel (``kernels/tree_attention.cpp``) where it runs: CPU, float32/bf16, built."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or not kernels.kernels_in_use():
        return None
    return kernels.small_gemm()


@contextlib.contextmanager
def row_runs(runs: list[RowRun] | None, packed: PackedRows | None = None, prompts: PromptRows | None = None,
             sizes: list[int] | None = None):
    """Inside the block, a forward of one packed sequence over a cache of rows attends each row over its own slots
    only (its mask allows nothing beyond): in one kernel call (``packed``, where the kernel runs), else run by run
    (``runs``), queries padded to the run's width; ``prompts``: a prefill of several prompts, each causal.
    ``sizes``: each row's tokens in the packed sequence, in row order (a model on eager attention: row by row)."""
    old = (getattr(_local, "runs", None), getattr(_local, "packed", None), getattr(_local, "prompts", None),
           getattr(_local, "sizes", None))
    _local.runs, _local.packed, _local.prompts, _local.sizes = runs, packed, prompts, sizes
    try:
        yield
    finally:
        _local.runs, _local.packed, _local.prompts, _local.sizes = old


def _prompt_rows(module, query, key, value, prompts: PromptRows, dropout, scaling, kwargs):
    """Each prompt's queries over its own row's keys, causal: the call a prefill of the prompt alone makes."""
    outs = []
    for i, (a, b) in enumerate(zip(prompts.starts, prompts.starts[1:])):
        r, n = prompts.first + i, b - a if prompts.keys is None else prompts.keys[i]
        q, k, v = query[:, :, a:b], key[r:r + 1, :, :n], value[r:r + 1, :, :n]
        out = _causal_prompt(module, q, k, v, dropout, scaling, kwargs) if n == b - a else (
            _prompt_rest(module, q, k, v, dropout, scaling, kwargs) or _rest_by_mask(module, q, k, v, dropout, scaling,
                                                                                     kwargs))
        outs.append(out[0])
    return torch.cat(outs, dim=1), None


def _rest_by_mask(module, query, key, value, dropout, scaling, kwargs):
    """The last queries of a prompt over all of its keys, causal (where the prompt kernel does not take them)."""
    t, n = query.shape[2], key.shape[2]
    allowed = torch.ones(t, n, dtype=torch.bool, device=query.device).tril(n - t)
    return sdpa_attention_forward(module, query, key, value, allowed[None, None], dropout=dropout, scaling=scaling,
                                  **kwargs)


def _prompt_kernel(module, query, key, value, dropout, kwargs):
    """The prompt-attention kernel if it takes this call (one sequence, bf16 on AVX-512 bf16, plain causal softmax,
    at least as many keys as queries), else None."""
    if (query.device.type == "cpu" and query.dtype == torch.bfloat16 and key.dtype == value.dtype == query.dtype
            and query.shape[0] == key.shape[0] == 1 and query.shape[2] <= key.shape[2] and not dropout
            and key.shape[1] > 0 and query.shape[1] % key.shape[1] == 0 and query.shape[-1] % 32 == 0
            and query.shape[-1] == key.shape[-1] == value.shape[-1]
            and key.stride(-1) == 1 and value.stride(-1) == 1 and getattr(module, "is_causal", True)
            and all(kwargs.get(k) is None for k in ("softcap", "position_bias", "s_aux", "sinks", "sliding_window"))):
        ext = kernel_for(query.device, query.dtype)
        if ext is not None and getattr(ext, "prompt_attention_ready", False):
            return ext
    return None


def _causal_prompt(module, query, key, value, dropout, scaling, kwargs):
    """A prompt's causal attention over its own keys (one sequence, as many keys as queries, no mask): the AVX-512
    bf16 kernel where it runs (``kernels/prompt_attention.cpp``: 2-3.5x torch's flash kernel on long prompts), else
    torch's. Prompts prefilled alone and packed together both come here, so they get the same bits."""
    ext = _prompt_kernel(module, query, key, value, dropout, kwargs) if query.shape[2] == key.shape[2] else None
    if ext is None:
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    return _on_prompt_kernel(ext, query, key, value, scaling)


def _on_prompt_kernel(ext, query, key, value, scaling):
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = ext.prompt_attention(query[0].transpose(0, 1).contiguous(), key[0], value[0], scale)  # [T, H, D]
    return out.unsqueeze(0), None


def _prompt_rest(module, query, key, value, dropout, scaling, kwargs):
    """The rest of a prompt after a cached prefix, causal over the prefix and itself, on the prompt kernel (the
    queries are the last of the keys' positions: the bits a prefill of the whole prompt gives those queries over the
    same keys); None where the kernel does not take it (the call's own 4-D mask then applies)."""
    ext = _prompt_kernel(module, query, key, value, dropout, kwargs)
    return None if ext is None else _on_prompt_kernel(ext, query, key, value, scaling)


@contextlib.contextmanager
def prompt_rest(tokens: int):
    """Inside the block, a forward of ``tokens`` queries over a cache that holds more keys is the rest of a prompt
    (causal over every key before it, as its 4-D mask says): its attention may take the prompt kernel."""
    old = getattr(_local, "rest", None)
    _local.rest = tokens
    try:
        yield
    finally:
        _local.rest = old


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


def _kernel_call(module, query, key, value, attention_mask, dropout, kwargs, packed: bool = False):
    """The kernel, if this call is one it takes (a 4-D additive mask, plain softmax attention, grouped heads; a
    single sequence's query no longer than a tree: a prefill goes to torch's kernels)."""
    if (attention_mask is None or dropout or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
            or any(kwargs.get(k) is not None for k in ("softcap", "position_bias", "s_aux", "sinks"))
            or key.shape[1] == 0 or query.shape[1] % key.shape[1] or key.stride(-1) != 1 or value.stride(-1) != 1
            or (query.shape[2] > MAX_FOLDED_QUERY and not packed)
            or key.dtype != query.dtype or value.dtype != query.dtype
            or not query.shape[-1] == key.shape[-1] == value.shape[-1]):  # MLA: values narrower than keys
        return None
    return kernel_for(query.device, query.dtype)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as an additive one (0 allowed, the dtype's minimum elsewhere); an additive one as it is."""
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def _mask_for_kernel(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    mask = _additive(mask, dtype)
    mask = mask if mask.dtype == dtype else mask.to(dtype)
    return mask if mask.stride(-1) == 1 else mask.contiguous()


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs):
    if isinstance(key, list):  # rows packed in one forward, each with a cache of its own (batching/head_pass.py)
        outs, t0 = [], 0
        for k, v, m in zip(key, value, attention_mask):
            t = m.shape[-2]
            outs.append(grouped_sdpa(module, query[:, :, t0:t0 + t], k, v, m, dropout, scaling, **kwargs)[0])
            t0 += t
        return torch.cat(outs, dim=1), None
    rest = getattr(_local, "rest", None)
    if rest is not None and query.shape[2] == rest < key.shape[2]:
        out = _prompt_rest(module, query, key, value, dropout, scaling, kwargs)
        if out is not None:
            return out
    prompts = getattr(_local, "prompts", None)
    if (prompts is not None and query.shape[0] == 1 and key.shape[0] == prompts.first + len(prompts.starts) - 1
            and query.shape[2] == prompts.starts[-1]):
        return _prompt_rows(module, query, key, value, prompts, dropout, scaling, kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    packed = getattr(_local, "packed", None)
    ext = _kernel_call(module, query, key, value, attention_mask, dropout, kwargs, packed is not None)
    if (ext is not None and packed is not None and query.shape[0] == 1 and key.shape[0] == packed.rows
            and query.shape[2] == packed.tokens):
        q = query[0].transpose(0, 1).contiguous()  # [T, H, D], token t of row packed.row[t]
        out = ext.tree_attention(q, key, value, _mask_for_kernel(attention_mask, query.dtype), packed.row,
                                 packed.node, packed.key_len, 0, scale)
        return out.unsqueeze(0), None
    if ext is not None and packed is None:  # one sequence (or rows side by side): query t of row b is node t
        B, H, T, D = query.shape
        q = query.transpose(1, 2).reshape(B * T, H, D).contiguous()
        out = ext.tree_attention(q, key, value, _mask_for_kernel(attention_mask, query.dtype), NO_INDEX, NO_INDEX,
                                 NO_INDEX, T, scale)
        return out.view(B, T, H, D), None
    # a batch the kernel does not take, or whose values are narrower than its keys (MLA: the runs' grids are query-wide)
    if ((packed is not None or value.shape[-1] != query.shape[-1])
            and _packed_rows(query, key, attention_mask) is not None):
        return _by_row(_attend, module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    runs = getattr(_local, "runs", None)
    if runs and query.shape[0] == 1 and key.shape[0] == runs[-1].end and query.shape[2] == runs[-1].t1:
        return _packed(module, query, key, value, attention_mask, runs, dropout=dropout, scaling=scaling, **kwargs)
    return _attend(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _attend(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    if attention_mask is None and query.shape[2] == key.shape[2]:  # a prompt over its own keys (a prefill)
        return _causal_prompt(module, query, key, value, dropout, scaling, kwargs)
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
    mask = _additive(mask, query.dtype)
    mask = mask.unsqueeze(2).expand(mask.shape[0], mask.shape[1], groups, T, L).reshape(mask.shape[0], mask.shape[1],
                                                                                         groups * T, L)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(B, H, T, D).transpose(1, 2).contiguous(), None


def rows_eager(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """A model on eager attention (Gemma-2's softcapping, or chosen by its user): the modeling module's own
    ``eager_attention_forward``, row by row where a batch's forward packs several rows' trees into one sequence (each
    row's nodes over its own slots with its own rows of the mask); anything else goes to it as it is."""
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        raise DraftTreeError(f"{type(module).__name__} has no eager_attention_forward in its modeling module: load the "
                             "model with attn_implementation='sdpa'")
    if _packed_rows(query, key, attention_mask) is None:
        return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    return _by_row(eager, module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _packed_rows(query: torch.Tensor, key: torch.Tensor, attention_mask) -> list[int] | None:
    """Each row's tokens where this call is a batch's forward of packed rows (``row_runs``' ``sizes``), else None."""
    sizes = getattr(_local, "sizes", None)
    if (sizes is None or attention_mask is None or query.shape[0] != 1 or key.shape[0] != len(sizes)
            or query.shape[2] != sum(sizes)):
        return None
    return sizes


def _by_row(attend, module, query, key, value, attention_mask, **kwargs):
    """``attend`` on each packed row's queries over its own slots with its own rows of the mask, concatenated."""
    outs, t0 = [], 0
    for r, m in enumerate(_local.sizes):
        outs.append(attend(module, query[:, :, t0:t0 + m], key[r:r + 1], value[r:r + 1],
                           attention_mask[r:r + 1, :, :m], **kwargs)[0])
        t0 += m
    return torch.cat(outs, dim=1), None


AttentionInterface.register(NAME, grouped_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)
AttentionInterface.register(NAME_EAGER, rows_eager)
AttentionMaskInterface.register(NAME_EAGER, eager_mask)


@contextlib.contextmanager
def grouped_attention(model: torch.nn.Module):
    """Run ``model`` with :func:`grouped_sdpa` inside the block if it was using SDPA, with :func:`rows_eager` if it
    was using eager attention (anything else as it is)."""
    config = model.config
    old = getattr(config, "_attn_implementation", None)
    if old not in ("sdpa", "eager"):
        yield
        return
    config._attn_implementation = NAME if old == "sdpa" else NAME_EAGER
    try:
        yield
    finally:
        config._attn_implementation = old
