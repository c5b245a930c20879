"""Where a model's layers meet the kernels: inside :func:`fast_linears`, a model's linear layers, Llama-style
RMSNorms, gated MLPs and rotary embeddings run the CPU kernels of :mod:`drafttree.kernels.gemm`; outside, the same
model object runs torch's own code (e.g. Hugging Face's ``generate``, our ``hf-ar`` baseline).

Nothing of the modeling code is forked: modules get a per-instance ``forward`` that calls the kernel inside a block
and the module's own forward elsewhere, and a norm, gated MLP or rotary function is taken over only after it gave the
kernel's result on random input (variants such as Gemma's ``1 + weight`` norm keep their own code).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sys
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from drafttree.cache import GrowingCache, cache_arg
from drafttree.kernels import gemm
from drafttree.kernels.gemm import _DTYPES, NO_INDEX, _active, _applies

_blocks = itertools.count()  # fast_linears blocks, numbered: what one computed is not reused by another


def _forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if _active.depth:
        if _applies(x, module.weight):
            return gemm._ext.linear(x, module.weight, module.bias)
        return gemm.many_rows_linear(x, module.weight, module.bias)
    return F.linear(x, module.weight, module.bias)


class SharedInput:
    """Linear layers a stock forward calls one after another on the same input (q/k/v, gate/up): the first call
    computes all of them in one kernel call and the others take their result, so the threads fork and join once.
    Any other call order, or another input, computes what is asked (the result is the same either way)."""

    def __init__(self, modules: list[torch.nn.Linear]):
        self.modules = modules
        self.pending: list | None = None  # [input, outputs (None once taken), the block they were computed in]

    def __getstate__(self) -> dict:  # a pickled or copied model carries no results of a past forward
        return {"modules": self.modules, "pending": None}

    def forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        pending = self.pending
        if (pending is not None and pending[0] is x and pending[1][index] is not None  # computed for this input,
                and pending[2] == _active.block):  # in this fast_linears block
            out, pending[1][index] = pending[1][index], None
            if all(o is None for o in pending[1]):
                self.pending = None
            return out
        module = self.modules[index]
        if not _active.depth:
            return F.linear(x, module.weight, module.bias)
        if not _applies(x, module.weight):
            return gemm.many_rows_linear(x, module.weight, module.bias)
        weights, biases, k, dtype = [], [], x.shape[-1], x.dtype
        for m in self.modules:
            w = m.weight
            if w.dtype != dtype or not w.is_contiguous() or w.shape[1] != k:
                return gemm._ext.linear(x, module.weight, module.bias)
            weights.append(w)
            biases.append(m.bias)
        outs = gemm._ext.linears(x, weights, biases)
        out, outs[index] = outs[index], None
        self.pending = [x, outs, _active.block]
        return out


def _shared_forward(group: SharedInput, index: int, x: torch.Tensor) -> torch.Tensor:
    return group.forward(index, x)


def _norm_forward(module: torch.nn.Module, eps: float, x: torch.Tensor) -> torch.Tensor:
    w = module.weight
    # _active_here(x, w), spelled out: this runs twice per layer per forward
    if (_active.depth and not _active.off and x.dtype == w.dtype and w.dtype in _DTYPES and x.is_cpu and w.is_cpu
            and x.dim() >= 1 and x.shape[-1] == w.shape[0] and not torch.is_grad_enabled()):
        return gemm._ext.rms_norm(x, w, eps)
    return type(module).forward(module, x)


def _plain_rms_norm(module: torch.nn.Module) -> float | None:
    """The module's epsilon if it computes Llama's RMSNorm (checked on random input against its own forward, so
    variants such as Gemma's ``1 + weight`` keep their own code), else None."""
    w = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if (not type(module).__name__.endswith("RMSNorm") or not isinstance(w, torch.Tensor) or w.dim() != 1
            or not isinstance(eps, float) or w.dtype not in _DTYPES or w.device.type != "cpu" or not w.is_contiguous()):
        return None
    with torch.inference_mode():
        x = torch.randn(3, w.shape[0], generator=torch.Generator().manual_seed(0)).to(w.dtype) * 3
        ref, ours = type(module).forward(module, x), gemm._ext.rms_norm(x, w, eps)
    if ref.shape != ours.shape or ref.dtype != ours.dtype:
        return None
    tol = 1e-5 if w.dtype == torch.float32 else 1e-2
    ok = torch.allclose(ours.float(), ref.float(), rtol=tol, atol=tol * float(ref.float().abs().max()))
    return eps if ok else None


def _mlp_forward(module: torch.nn.Module, biases: bool, x: torch.Tensor) -> torch.Tensor:
    gate, up, down = module.gate_proj.weight, module.up_proj.weight, module.down_proj.weight
    if (_active.depth and _applies(x, gate) and x.shape[-1] == gate.shape[1]
            and all(w.dtype == x.dtype and w.is_contiguous() for w in (up, down))):
        bs = [module.gate_proj.bias, module.up_proj.bias, module.down_proj.bias] if biases else []
        return gemm._ext.gated_mlp(x, gate, up, down, bs)
    if _active.depth and not torch.is_grad_enabled():
        # many rows (a prompt): the stock forward's ops, the activation and product in place. The stock code's two
        # fresh [rows, intermediate] tensors per layer (first-touch pages of a few MB each) cost ~5% of a packed
        # 16-user prefill here (logs/s63_prefill_ab.py); the same ops in place give the same bits
        gated = F.silu(module.gate_proj(x), inplace=True).mul_(module.up_proj(x))
        return module.down_proj(gated)
    return type(module).forward(module, x)


def _plain_gated_mlp(module: torch.nn.Module) -> bool:
    """Whether the module computes ``down(silu(gate(x)) * up(x))`` (Llama's MLP; checked on random input against its
    own forward, so other activations or layouts keep their own code)."""
    parts = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    act = getattr(module, "act_fn", None)
    if not (all(type(p) is torch.nn.Linear for p in parts) and type(act).__name__ in ("SiLU", "SiLUActivation")):
        return False
    w = parts[0].weight
    if (w.dtype not in _DTYPES or w.device.type != "cpu" or parts[1].weight.shape != w.shape
            or parts[2].in_features != w.shape[0] or parts[2].out_features != w.shape[1]
            or any(p.weight.dtype != w.dtype for p in parts)):
        return False
    biases = any(p.bias is not None for p in parts)
    with torch.inference_mode():
        x = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.dtype)
        bs = [p.bias for p in parts] if biases else []
        ref = type(module).forward(module, x)
        ours = gemm._ext.gated_mlp(x, *(p.weight.contiguous() for p in parts), bs)
    if ref.shape != ours.shape or ref.dtype != ours.dtype:
        return False
    tol = 1e-4 if w.dtype == torch.float32 else 3e-2  # torch's products and the kernel's round differently
    return torch.allclose(ours.float(), ref.float(), rtol=tol, atol=tol * float(ref.float().abs().max()))


def _active_here(*tensors: torch.Tensor) -> bool:
    """Inside a fast_linears block, kernels not switched off, CPU tensors of one kernel dtype, no autograd."""
    dtype = tensors[0].dtype
    return (bool(_active.depth) and not _active.off and dtype in _DTYPES
            and not torch.is_grad_enabled() and all(t.is_cpu and t.dtype == dtype for t in tensors))


def _kernel_rotary(original):
    """``apply_rotary_pos_emb`` through the kernel where the call is the plain case, the original otherwise. The kernel
    (vectorised; a prompt's tokens split over the threads) took 3 us against torch's 41 for one token, 11 against 54
    for 16 and 0.7 ms against 1.3 for a 2,629-token packed prefill (Zen 4, bf16, 2 threads, per layer)."""

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if (not _active.depth or _active.off or args or (kwargs and (len(kwargs) > 1
                or kwargs.get("unsqueeze_dim", 0) != 1)) or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3
                or q.shape[-1] != cos.shape[-1] or cos.stride(-1) != 1 or sin.shape != cos.shape
                or sin.stride() != cos.stride() or not _active_here(q, k, cos, sin)):
            return original(q, k, cos, sin, *args, **kwargs)
        q_out, k_out = gemm._ext.rotary(q, k, cos, sin)
        return q_out, k_out

    if not isinstance(original, torch.nn.Module):
        apply_rotary_pos_emb = functools.wraps(original)(apply_rotary_pos_emb)
        apply_rotary_pos_emb._drafttree_original = original
        return apply_rotary_pos_emb

    stock = type(original)

    class KernelRotary(stock):
        """transformers >= 5.25 makes the function a ``kernels`` module, gives each attention module a copy and
        pickles (and deep-copies) that copy as ``type(modeling.apply_rotary_pos_emb)()``: here that call builds the
        stock module, so copies stay stock (a model that ran here still pickles), while this instance's ``__call__``
        takes the kernel without the module call machinery."""

        __module__ = stock.__module__
        _drafttree_original = original

        def __new__(cls, *args, **kwargs):
            return stock()

        def __call__(self, *args, **kwargs):
            return apply_rotary_pos_emb(*args, **kwargs)

    fast = object.__new__(KernelRotary)
    stock.__init__(fast)
    return fast


def _install_rotary(model: torch.nn.Module) -> None:
    """Route the ``apply_rotary_pos_emb`` of the modeling modules ``model`` uses through the kernel, for each only
    if it gives the kernel's result (bitwise) on random input."""
    for name in {type(m).__module__ for m in model.modules()}:
        module = sys.modules.get(name)
        original = getattr(module, "apply_rotary_pos_emb", None)
        if not callable(original) or hasattr(original, "_drafttree_original"):
            continue
        g = torch.Generator().manual_seed(0)
        ok = True
        for dtype, tokens, dim in ((d, t, n) for d in _DTYPES for t, n in ((3, 16), (200, 64))):  # the vector path
            q, k = (torch.randn(2, 4, tokens, dim, generator=g).to(dtype) for _ in range(2))  # and a prompt's threads
            cos, sin = (torch.randn(2, tokens, dim, generator=g).to(dtype) for _ in range(2))
            try:  # a module's own function may take other arguments (GPT-J's: one tensor, sin, cos): not Llama's
                with torch.inference_mode():
                    ref, ours = original(q, k, cos, sin), gemm._ext.rotary(q, k, cos, sin)
            except (TypeError, ValueError, RuntimeError):
                ok = False
                break
            ok = ok and all(torch.equal(a, b) for a, b in zip(ref, ours, strict=True))
        if ok:
            module.apply_rotary_pos_emb = _kernel_rotary(original)


class LeanLayer:
    """A Llama-style decoder layer's own steps as straight kernel calls, without the module machinery around them.

    A decode step's layer makes ~15 nested module calls (each with transformers' wrappers, hooks and our per-call
    checks) around ~8 kernel calls of a few tens of microseconds: ~2 ms of a ~18 ms SmolLM2 step. Inside
    fast_linears blocks this calls the kernels the installed per-module functions would call, in the same order
    (norm, q/k/v in one call, rotary, cache, the configured attention function, o_proj, residual, norm, gated MLP,
    residual), so the result is bitwise the stock forward's; it is installed only for layers made of exactly
    those parts, each of which took its kernel, and only after it gave the stock forward's bits on random input.
    Anything else (more rows than the kernel takes, another dtype, extra arguments, training) runs the stock
    forward."""

    KEYS = frozenset({"attention_mask", "position_ids", "cache", "past_key_values", "use_cache",
                      "position_embeddings"})

    def __init__(self, layer: torch.nn.Module, norm1: tuple | None, norm2: tuple, qkv: SharedInput, mlp: tuple):
        attn = layer.self_attn
        self.layer, self.attn = layer, attn
        self.norm1 = None if norm1 is None else (norm1[0].weight, norm1[1])  # (weight, eps); None: an identity
        self.norm2 = (norm2[0].weight, norm2[1])
        self.qkv = ([m.weight for m in qkv.modules], [m.bias for m in qkv.modules])
        self.o_proj = (attn.o_proj.weight, attn.o_proj.bias)
        parts = [getattr(mlp[0], n) for n in ("gate_proj", "up_proj", "down_proj")]
        self.mlp = ([p.weight for p in parts], [p.bias for p in parts] if mlp[1] else [])
        self.head_dim, self.layer_idx, self.scaling = attn.head_dim, attn.layer_idx, attn.scaling
        self.modeling = sys.modules[type(attn).__module__]  # apply_rotary_pos_emb is looked up per call
        self.eager = getattr(self.modeling, "eager_attention_forward", None)

    def __getstate__(self) -> dict:  # pickled with the model (as SharedInput is): a module by its name
        return dict(self.__dict__, modeling=self.modeling.__name__)

    def __setstate__(self, state: dict) -> None:
        state["modeling"] = sys.modules[state["modeling"]]
        self.__dict__.update(state)

    def forward(self, hidden_states: torch.Tensor, *args, **kw) -> torch.Tensor:
        layer, attn, ext = self.layer, self.attn, gemm._ext
        cache = kw.get("cache", kw.get("past_key_values"))
        pe = kw.get("position_embeddings")
        weights, biases = self.qkv
        if (args or not _active.depth or cache is None or pe is None or not self.KEYS.issuperset(kw)
                or layer.training or hidden_states.dim() != 3 or not _applies(hidden_states, weights[0])):
            return type(layer).forward(layer, hidden_states, *args, **kw)
        fused = self._fused(hidden_states, cache, pe, kw.get("attention_mask"))
        if fused is not None:
            return fused
        x = hidden_states if self.norm1 is None else ext.rms_norm(hidden_states, *self.norm1)
        q, k, v = ext.linears(x, weights, biases)
        shape = (*x.shape[:-1], -1, self.head_dim)
        q, k, v = q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)
        cos, sin = pe
        rotary = self.modeling.apply_rotary_pos_emb
        if (hasattr(rotary, "_drafttree_original") and cos.dim() == 3 and cos.shape[-1] == self.head_dim
                and cos.stride(-1) == 1 and sin.shape == cos.shape and sin.stride() == cos.stride()
                and cos.dtype == x.dtype and sin.dtype == x.dtype and cos.is_cpu and sin.is_cpu):
            q, k = ext.rotary(q, k, cos, sin)  # what our wrapper (installed after its bitwise check) calls
        else:
            q, k = rotary(q, k, cos, sin)
        if type(cache) is GrowingCache and self.layer_idx < len(cache.layers):  # Cache.update's plain case
            k, v = cache.layers[self.layer_idx].update(k, v)
        else:
            k, v = cache.update(k, v, self.layer_idx)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, self.eager)
        out, _ = attend(attn, q, k, v, kw.get("attention_mask"), dropout=0.0, scaling=self.scaling)
        hidden_states = hidden_states + ext.linear(out.reshape(*x.shape[:-1], -1).contiguous(), *self.o_proj)
        return hidden_states + ext.gated_mlp(ext.rms_norm(hidden_states, *self.norm2), *self.mlp[0], self.mlp[1])

    def _fused(self, hidden: torch.Tensor, cache, pe: tuple, mask: torch.Tensor | None) -> torch.Tensor | None:
        """The whole layer in one kernel call (``decode_layer.cpp``: the same kernels and ops as :meth:`forward`, in
        the same order) where this call is its plain case: a GrowingCache layer with room for the new states (one
        sequence, rows side by side, or a batch's rows packed in one sequence and scattered into their rows), our
        rotary kernel, our attention kernel. None: :meth:`forward` does the steps."""
        if type(cache) is not GrowingCache or self.layer_idx >= len(cache.layers):
            return None
        return self.fused_with(hidden, cache, pe, _fused_plan(self, hidden.dtype, pe, mask))

    def fused_with(self, hidden: torch.Tensor, cache: GrowingCache, pe: tuple, plan: tuple | None
                   ) -> torch.Tensor | None:
        """:meth:`_fused` with this forward's plan (``_fused_plan``: the same for every layer of a forward)."""
        if plan is None or self.layer_idx >= len(cache.layers):
            return None
        layer = cache.layers[self.layer_idx]
        buf, n = layer._k, hidden.shape[1]
        if buf is None or buf.dtype != hidden.dtype or layer.copies:
            return None
        rows = buf.shape[0] if layer._rows is None else layer._rows
        if layer.scatter is None:  # GrowingLayer.update's append
            index, slots, start, length = NO_INDEX, NO_INDEX, layer._len, layer._len + n
            if layer._rows is not None or rows != hidden.shape[0]:
                return None
        else:  # GrowingLayer._update_rows
            (index, slots), start, length = layer.scatter, 0, max(layer._len, layer.row_end)
        if length > buf.shape[-2]:
            return None
        kernel_mask, packed = plan
        if (packed is None) != (layer.scatter is None) or (packed is not None and (
                hidden.shape[0] != 1 or packed.rows != rows or packed.tokens != n)):
            return None
        q_row, q_node, key_len = ((NO_INDEX,) * 3 if packed is None
                                  else (packed.row, packed.node, packed.key_len))
        out, layer.keys, layer.values = gemm._ext.decode_layer(
            hidden, None if self.norm1 is None else self.norm1[0], 0.0 if self.norm1 is None else self.norm1[1],
            *self.qkv, *pe, buf, layer._v, start, length, rows, index, slots, kernel_mask, q_row, q_node, key_len,
            self.scaling, self.head_dim, *self.o_proj, *self.norm2, *self.mlp)
        layer._len = length
        return out


class _Plan(threading.local):
    """Per thread, the last forward's answer to "may its layers run as one kernel call each": every layer of a
    forward gets the same position embeddings and mask objects, so the checks run once per forward."""

    key: tuple = ()
    plan: tuple | None = None


_plan = _Plan()


def _fused_plan(lean: LeanLayer, dtype: torch.dtype, pe: tuple, mask: torch.Tensor | None) -> tuple | None:
    """(the mask as the attention kernel takes it, the batch's packed rows or None) if this forward's layers may run
    fused (see LeanLayer._fused), else None."""
    from drafttree import attention  # imported here: drafttree.attention imports this package

    packed = getattr(attention._local, "packed", None)
    key = (pe, mask, dtype, lean.modeling, lean.attn.config, lean.head_dim, packed)
    if len(_plan.key) == len(key) and all(a is b for a, b in zip(_plan.key, key, strict=True)):
        return _plan.plan
    cos, sin = pe
    impl = lean.attn.config._attn_implementation
    ok = (mask is not None and mask.dim() == 4 and mask.shape[1] == 1 and mask.is_cpu
          and getattr(lean.modeling.apply_rotary_pos_emb, "_drafttree_original", None) is not None
          and isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor) and cos.dim() == 3
          and cos.shape[-1] == lean.head_dim and cos.stride(-1) == 1 and sin.shape == cos.shape
          and sin.stride() == cos.stride() and cos.dtype == dtype and sin.dtype == dtype and cos.is_cpu
          and sin.is_cpu and ALL_ATTENTION_FUNCTIONS.get_interface(impl, lean.eager) is attention.grouped_sdpa
          and attention.kernel_for(mask.device, dtype) is not None)
    _plan.key, _plan.plan = key, (attention._mask_for_kernel(mask, dtype), packed) if ok else None
    return _plan.plan


def _lean_forward(lean: LeanLayer, hidden_states: torch.Tensor, *args, **kw) -> torch.Tensor:
    return lean.forward(hidden_states, *args, **kw)


def _installed(module: torch.nn.Module, func) -> tuple | None:
    """The arguments ``module``'s forward was bound with, if it is ``func`` (installed by :func:`_install`)."""
    fwd = module.__dict__.get("forward")
    return fwd.args if isinstance(fwd, functools.partial) and fwd.func is func else None


def _lean_layer(layer: torch.nn.Module) -> LeanLayer | None:
    """A :class:`LeanLayer` for ``layer`` if it is exactly a Llama-style decoder layer whose parts all take the
    kernels and it gives the stock forward's bits on random input; else None (the layer keeps its own forward)."""
    if {n for n, _ in layer.named_children()} != {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}:
        return None
    attn = layer.self_attn
    if ({n for n, _ in attn.named_children()} != {"q_proj", "k_proj", "v_proj", "o_proj"}
            or getattr(attn, "sliding_window", None) is not None or not hasattr(attn, "config")
            or not all(isinstance(getattr(attn, a, None), t) for a, t in
                       (("head_dim", int), ("layer_idx", int), ("scaling", float)))):
        return None
    # an EAGLE-1 head's layer has no input norm (an identity in its place)
    identity = type(layer.input_layernorm) is torch.nn.Identity
    norm1, norm2 = _installed(layer.input_layernorm, _norm_forward), _installed(layer.post_attention_layernorm,
                                                                                _norm_forward)
    mlp = _installed(layer.mlp, _mlp_forward)
    qkv = [_installed(getattr(attn, n), _shared_forward) for n in ("q_proj", "k_proj", "v_proj")]
    if (norm1 is None and not identity) or norm2 is None or mlp is None or any(a is None for a in qkv):
        return None
    group = qkv[0][0]
    if any(a != (group, i) for i, a in enumerate(qkv)) or _installed(attn.o_proj, _forward) is None:
        return None
    lean = LeanLayer(layer, norm1, norm2, group, mlp)
    return lean if _gives_the_stock_bits(lean) else None


def _gives_the_stock_bits(lean: LeanLayer) -> bool:
    """Under the layer's own attention and under ours (where the fused path runs), two forwards (3 tokens into an
    empty cache, then 2 more) through the stock forward and through ``lean``: the same outputs and keys, bit for bit."""
    from drafttree import attention  # imported here: drafttree.attention imports this package

    config = lean.attn.config
    own = config._attn_implementation
    try:
        for impl in dict.fromkeys((own, attention.NAME)):
            config._attn_implementation = impl
            if not _same_bits(lean):
                return False
    finally:
        config._attn_implementation = own
    return True


def _same_bits(lean: LeanLayer) -> bool:
    layer, attn = lean.layer, lean.attn
    w = lean.qkv[0][0]
    g = torch.Generator().manual_seed(0)
    n = 5
    x = torch.randn(1, n, w.shape[1], generator=g).to(w.dtype)
    cos, sin = (torch.randn(1, n, lean.head_dim, generator=g).to(w.dtype) for _ in range(2))
    mask = torch.zeros(1, 1, n, n, dtype=w.dtype).masked_fill_(~torch.ones(n, n, dtype=torch.bool).tril(),
                                                               torch.finfo(w.dtype).min)
    was = layer.training
    layer.train(False)
    outs, keys = [], []
    _active.depth += 1
    try:
        with torch.inference_mode():
            for run in (type(layer).forward, _lean_forward):
                cache = GrowingCache()
                first = layer if run is type(layer).forward else lean
                for a, b in ((0, 3), (3, n)):
                    kw = {"attention_mask": mask[:, :, a:b, :b], "position_ids": torch.arange(a, b)[None],
                          "use_cache": True, "position_embeddings": (cos[:, a:b], sin[:, a:b])}
                    outs.append(run(first, x[:, a:b], **kw, **{cache_arg(layer): cache}))
                keys.append(cache.layers[attn.layer_idx].keys.clone())
    except Exception:  # noqa: BLE001 - a layer the lean path cannot run keeps its own forward
        return False
    finally:
        _active.depth -= 1
        layer.train(was)
    pairs = ((outs[0], outs[2]), (outs[1], outs[3]), (keys[0], keys[1]))
    return all(a.shape == b.shape and torch.equal(a, b) for a, b in pairs)


# names of linear layers that stock forwards call in a row on one input
SHARED_INPUT_NAMES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _install(model: torch.nn.Module) -> None:
    """Route every eligible ``nn.Linear`` of ``model`` through :func:`_forward`, linear layers that share their input
    through one :class:`SharedInput` each, and Llama-style RMSNorms through the kernel (once per model)."""
    if getattr(model, "_drafttree_small_gemm", False):
        return
    gemm.pack_weights(model)  # first: the checks below run products (where bf16 products take packed weights)
    for module in model.modules():
        for names in SHARED_INPUT_NAMES:
            parts = [getattr(module, n, None) for n in names]
            if all(type(p) is torch.nn.Linear and "forward" not in p.__dict__ for p in parts) and len(
                    {p.in_features for p in parts}) == 1:
                group = SharedInput(parts)
                for i, p in enumerate(parts):
                    p.forward = functools.partial(_shared_forward, group, i)
        eps = _plain_rms_norm(module) if "forward" not in module.__dict__ else None
        if eps is not None:
            module.forward = functools.partial(_norm_forward, module, eps)
    for module in model.modules():
        # every plain Linear: whether a call can take the kernel (device, dtype, layout, rows) is checked per call
        if type(module) is torch.nn.Linear and "forward" not in module.__dict__:
            module.forward = functools.partial(_forward, module)  # unlike a bound method, it pickles
    for module in model.modules():  # after the Linears: the check runs the module's own forward through them
        if "forward" not in module.__dict__ and _plain_gated_mlp(module):
            biases = any(getattr(module, n).bias is not None for n in ("gate_proj", "up_proj", "down_proj"))
            module.forward = functools.partial(_mlp_forward, module, biases)
    _install_rotary(model)
    for module in model.modules():  # last: a lean layer calls the functions installed above
        lean = _lean_layer(module) if "forward" not in module.__dict__ else None
        if lean is not None:
            module.forward = functools.partial(_lean_forward, lean)
    model._drafttree_small_gemm = True


@contextlib.contextmanager
def fast_linears(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model``'s linear layers with the small-GEMM kernel inside the block (where it applies)."""
    weight = next(model.parameters(), None)
    if weight is None or weight.device.type != "cpu" or gemm.small_gemm() is None:
        yield
        return
    _install(model)
    _active.depth += 1
    outer, _active.block = _active.block, next(_blocks)
    try:
        yield
    finally:
        _active.depth -= 1
        _active.block = outer


@contextlib.contextmanager
def torch_linears() -> Iterator[None]:
    """Inside the block :func:`fast_linears` is inert and attention takes torch's path too (``attention.kernel_for``):
    torch's kernels only, for side-by-side measurements."""
    _active.off += 1
    try:
        yield
    finally:
        _active.off -= 1
