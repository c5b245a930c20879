"""The decoder stack's loop without the modeling code around it: embedding, rotary tables, one call per lean layer,
final norm.

Beyond its layers' kernels, transformers' model forward costs ~1.5 ms of a ~9 ms SmolLM2 decode step on a 2-core CPU
(decorators that check and merge arguments, the causal-mask helper, a ModuleList slice built per call, each layer's
``Module.__call__``). Where every decoder layer runs as a :class:`~drafttree.kernels.layers.LeanLayer` and the call
is the plain case of a verify step (token ids, one 4-D additive mask, positions, our growing cache), the same modules'
steps run here in the same order. It is used for a model only after it gave the stock forward's bits on that model
(a 4-token prompt, then 3 tokens on top, hidden states and cached keys compared); anything else runs the stock forward.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from drafttree.cache import GrowingCache, cache_arg
from drafttree.kernels.gemm import _active, _applies, kernel_rows
from drafttree.kernels.layers import LeanLayer, _fused_plan, _installed, _lean_forward

PLAIN_KEYS = frozenset({"input_ids", "attention_mask", "position_ids", "use_cache", "cache", "past_key_values"})
# base model -> (the device its weights were on, whether the loop gave the stock forward's bits there)
_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class LoopOutput:
    """What callers read of the stock output (``BaseModelOutputWithPast``)."""

    last_hidden_state: torch.Tensor


def _lean_layers(base: torch.nn.Module) -> list[LeanLayer] | None:
    layers = getattr(base, "layers", None)
    if (layers is None or not all(hasattr(base, a) for a in ("embed_tokens", "norm", "rotary_emb"))
            or len(layers) != getattr(base.config, "num_hidden_layers", -1)):
        return None
    leans = [_installed(layer, _lean_forward) for layer in layers]
    return None if any(a is None for a in leans) else [a[0] for a in leans]


def _loop(base, leans: list[LeanLayer], ids, mask, positions, cache, feature_layers) -> tuple:
    """Each layer as one kernel call where its checks pass (``LeanLayer.fused_with``, the plan made once: every layer
    gets the same rotary tables and mask), else through its lean forward (which falls back to the stock one)."""
    hidden = base.embed_tokens(ids)
    pe = base.rotary_emb(hidden, position_ids=positions)
    key, caught = cache_arg(base.layers[0]), {}
    plan = _fused_plan(leans[0], hidden.dtype, pe, mask) if _active.depth and hidden.dim() == 3 else None
    for i, lean in enumerate(leans):
        if feature_layers and i in feature_layers:
            caught[i] = hidden
        out = (lean.fused_with(hidden, cache, pe, plan)
               if plan is not None and not lean.layer.training and _applies(hidden, lean.qkv[0][0]) else None)
        hidden = out if out is not None else lean.forward(
            hidden, attention_mask=mask, position_embeddings=pe, position_ids=positions, use_cache=True,
            **{key: cache})
    aux = torch.cat([caught[i] for i in feature_layers], dim=-1) if feature_layers else None
    return LoopOutput(base.norm(hidden)), aux


def _gives_the_stock_bits(base, leans: list[LeanLayer]) -> bool:
    """A 4-token prompt and then 3 tokens on top (a tree: the last two are siblings), through the stock forward and
    through the loop, each into a fresh cache: the same hidden states and keys, bit for bit."""
    from drafttree.attention import row_runs  # imported here: drafttree.attention imports this package

    weight = base.embed_tokens.weight
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, weight.shape[0], (1, 7), generator=g).to(weight.device)
    allowed = torch.ones(7, 7, dtype=torch.bool).tril()
    allowed[6, 5] = False  # node 6 is node 5's sibling
    mask = torch.zeros(7, 7, dtype=weight.dtype).masked_fill_(~allowed, torch.finfo(weight.dtype).min)
    mask = mask[None, None].to(weight.device)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 5]], device=weight.device)
    key, outs, keys = cache_arg(base), [], []
    try:
        with row_runs(None), kernel_rows(None, 0):  # a lone sequence's forwards, whatever the caller's batch
            for loop in (False, True):
                cache = GrowingCache()
                for a, b in ((0, 4), (4, 7)):
                    args = (ids[:, a:b], mask[:, :, a:b, :b], positions[:, a:b])
                    out = (_loop(base, leans, *args, cache, None)[0] if loop else
                           base(input_ids=args[0], attention_mask=args[1], position_ids=args[2], use_cache=True,
                                **{key: cache}))
                    outs.append(out.last_hidden_state)
                keys.append(torch.stack([layer.keys[..., :7, :] for layer in cache.layers]))
    except Exception:  # noqa: BLE001 - a model the loop cannot run keeps its own forward
        return False
    pairs = ((outs[0], outs[2]), (outs[1], outs[3]), (keys[0], keys[1]))
    return all(a.shape == b.shape and torch.equal(a, b) for a, b in pairs)


def model_forward(base: torch.nn.Module, feature_layers: list[int] | None, kw: dict) -> tuple | None:
    """(output, the feature layers' inputs side by side or None) of ``base(**kw)`` through the loop, or None where the
    loop does not apply (the caller runs the stock forward). Call inside ``fast_linears`` and ``grouped_attention``."""
    if not PLAIN_KEYS.issuperset(kw) or not kw.get("use_cache"):
        return None
    ids, mask, positions = kw.get("input_ids"), kw.get("attention_mask"), kw.get("position_ids")
    cache = kw.get("cache", kw.get("past_key_values"))
    if (ids is None or positions is None or type(cache) is not GrowingCache or not isinstance(mask, torch.Tensor)
            or mask.dim() != 4 or base.training):
        return None
    leans = _lean_layers(base)
    if leans is None:
        return None
    return _loop(base, leans, ids, mask, positions, cache, feature_layers) if _check(base, leans) else None


def _check(base, leans: list[LeanLayer] | None) -> bool:
    """Whether the loop gives ``base``'s stock bits on the device its weights are on now (checked once there)."""
    device = base.embed_tokens.weight.device
    done = _checked.get(base)
    if done is None or done[0] != device:
        done = _checked[base] = (device, leans is not None and _gives_the_stock_bits(base, leans))
    return done[1]


def loop_applies(model: torch.nn.Module) -> bool:
    """Whether ``model``'s verify forwards take the loop (its check run now if it has not run yet)."""
    from drafttree.attention import grouped_attention  # imported here: drafttree.attention imports this package
    from drafttree.kernels.layers import fast_linears

    base = model.base_model
    with grouped_attention(model), fast_linears(model), torch.inference_mode():
        return _check(base, _lean_layers(base))
