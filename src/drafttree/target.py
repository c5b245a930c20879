"""A thin wrapper over any stock `transformers` causal LM for tree verification.

No modeling code is forked: a tree of new tokens is verified in one ordinary forward call by giving the
model a 4-D additive attention mask (each node sees the committed past, its ancestors and itself) and
explicit position ids (past length + depth). The KV cache is a plain ``DynamicCache``; committing an
accepted root-to-leaf path keeps the past plus those slots and drops the rest of the tree.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from drafttree.attention import grouped_attention, prompt_rest
from drafttree.cache import GrowingCache, cache_arg
from drafttree.errors import DraftTreeError
from drafttree.kernels import fast_linears
from drafttree.kernels.model_loop import model_forward
from drafttree.models import text_only


@dataclass
class ForwardOutput:
    # [n, vocab] next-token logits at every input position, in the LM head's dtype (float32 where a softcap applies):
    # greedy acceptance needs only their argmax; whoever needs probabilities widens the rows it reads
    logits: torch.Tensor
    # [n, hidden] the LM head's input (last hidden state after the final norm); with ``feature_layers``,
    # [n, k * hidden]: the inputs of those layers side by side (what an EAGLE-3 head drafts from)
    features: torch.Tensor


def tree_attention_mask(
    attend: torch.Tensor, past_len: int, dtype: torch.dtype, sliding_window: int | None = None,
    query_pos: torch.Tensor | None = None, tail_pos: torch.Tensor | None = None,
) -> torch.Tensor:
    """Additive mask [1, 1, m, past_len + s] from ``attend`` [m, s] over the uncommitted tail slots.

    0 where a query may attend (the whole committed past, and the tail slots ``attend`` allows: its
    ancestors and itself), the dtype's minimum elsewhere. With ``sliding_window``, keys further than the
    window from the query are masked too (for the sliding layers of hybrid models).
    """
    m, s = attend.shape
    allowed = torch.ones(m, past_len + s, dtype=torch.bool, device=attend.device)
    allowed[:, past_len:] = attend
    if sliding_window is not None:
        key_pos = torch.cat([torch.arange(past_len, device=attend.device), tail_pos])
        allowed &= (query_pos[:, None] - key_pos[None, :]) < sliding_window
    mask = torch.zeros(m, past_len + s, dtype=dtype, device=attend.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


# layers whose state is not one key and value per token: a tree's branches cannot each see only their own path
RECURRENT_LAYERS = frozenset({"linear_attention", "conv", "hybrid", "hybrid_sliding", "mamba", "recurrent"})
RECURRENT_MODELS = frozenset({"mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm", "recurrent_gemma", "reformer",
                              "xlnet"})
TREE_LAYERS = frozenset({"full_attention", "sliding_attention"})  # the kinds of attention the tree masks are built for
# model types whose forward a tree or chain cannot take, with why (stop 77: measured on tiny random models)
UNSUPPORTED_MODELS = {
    "cpmant": "its cached decoding differs from its own full forward over the same tokens (it prepends prompt tokens "
              "of its own), so no drafted token can be verified against it",
    "dory": "its recurrent section runs its layers in loops, each loop keeping keys and values in extra cache layers "
            "that only its own cache bookkeeping knows of",
}
# model types whose attention takes no packed batch (batching/target.py: attends_rows): Doge's dynamic-mask attention
# shapes its mask by the batch's query length, not each row's
ONE_ROW_MODELS = frozenset({"doge"})


def check_architecture(model: torch.nn.Module, chains: bool = False) -> None:
    """A one-line error for a model whose forward cannot verify a tree exactly: ALiBi models (BLOOM, MPT, Falcon with
    ``alibi``) build their position biases from a 2-D padding mask and take neither a 4-D mask nor position ids;
    recurrent layers (Mamba, linear attention, short convolutions: Jamba, Qwen3-Next, LFM2, ...) carry a state that
    every token of a tree would advance, whatever its branch; and the tree masks are built for full and sliding-window
    attention only (Llama 4's chunked or DeepSeek-V3.2's indexed attention would attend where they must not).
    ``chains``: the model verifies chains with its own causal masks (:mod:`drafttree.chain_target`), which every
    layer type takes; only a forward without a cache is refused."""
    cfg = model.config
    kind = getattr(cfg, "model_type", type(model).__name__)
    try:
        params = inspect.signature(type(model.base_model).forward).parameters
    except (TypeError, ValueError):
        params = None
    if kind in UNSUPPORTED_MODELS:
        raise DraftTreeError(f"{kind}: {UNSUPPORTED_MODELS[kind]}; this architecture is not supported")
    if params is not None and not {"cache", "past_key_values"} & set(params):
        raise DraftTreeError(f"{kind}: its forward keeps no KV cache, which a draft tree is verified against; this "
                             "architecture is not supported")
    if chains:
        return
    if getattr(cfg, "alibi", False) or kind in ("bloom", "mpt"):
        raise DraftTreeError(f"{kind} models add ALiBi position biases built from a 2-D padding mask; a draft tree "
                             "needs a 4-D attention mask and explicit positions, so this architecture is not supported")
    why = tree_refusal(model)
    if why:
        raise DraftTreeError(f"{kind}: {why}")



def recurrent_layers(model: torch.nn.Module) -> list[str] | None:
    """The kinds of the model's layers that carry a recurrent state (``[]``: the whole model is one, as Mamba),
    or None when every layer keeps one key and value per token."""
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    kinds = sorted(set(getattr(text, "layer_types", None) or []) & RECURRENT_LAYERS)
    if kinds:
        return kinds
    return [] if getattr(cfg, "model_type", None) in RECURRENT_MODELS else None


def tree_refusal(model: torch.nn.Module) -> str | None:
    """Why the model's layers cannot verify a tree in one forward (None: they can)."""
    recurrent = recurrent_layers(model)
    if recurrent is not None:
        what = f"its {', '.join(recurrent)} layers carry" if recurrent else "it carries"
        return f"{what} a recurrent state that every token of a draft tree would advance, whatever its branch"
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    other = sorted(set(getattr(text, "layer_types", None) or []) - TREE_LAYERS - RECURRENT_LAYERS
                   - {"dummy", "mlp", "moe"})
    if other:
        return (f"drafttree builds tree masks for full and sliding-window attention; its {', '.join(other)} layers "
                "are not supported")
    return None


def own_logit_scale(model: torch.nn.Module, lm_head: torch.nn.Module, softcap: float | None) -> float:
    """What the model multiplies its output embeddings' product with the last hidden state by to make its logits
    (Cohere's ``logit_scale``, 1 / Granite's ``logits_scaling``, 1.0 for most), checked once per model object on a
    three-token forward against the model's own logits, so that sampling draws from the model's distribution; a model
    whose logits are something else (ModernBERT's prediction head) gets a one-line error."""
    known = getattr(model, "_drafttree_logit_scale", None)
    if known is not None:
        return known
    cfg, kind = model.config, getattr(model.config, "model_type", type(model).__name__)
    if model.base_model is model:
        raise DraftTreeError(f"{kind}: its causal LM keeps no base model of its own (base_model_prefix), which the "
                             "tree forward runs; this architecture is not supported")
    device = lm_head.weight.device
    ids = torch.tensor([[1, 2, 3]], device=device) % int(lm_head.weight.shape[0])
    with torch.inference_mode():
        ref = model(input_ids=ids, use_cache=False).logits[0].float()
        hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state[0]
        raw = lm_head(hidden.to(lm_head.weight.dtype)).float()  # Mamba keeps its residual in float32
    tol = (1e-4 if lm_head.weight.dtype == torch.float32 else 2e-2) * (1.0 + ref.abs().max().item())
    candidates = [1.0]
    if getattr(cfg, "logit_scale", None):
        candidates.append(float(cfg.logit_scale))
    if getattr(cfg, "logits_scaling", None):
        candidates.append(1.0 / float(cfg.logits_scaling))
    for scale in candidates:
        mine = raw * scale
        if softcap:
            mine = torch.tanh(mine / softcap) * softcap
        if (mine - ref).abs().max().item() <= tol:
            model._drafttree_logit_scale = scale
            return scale
    raise DraftTreeError(f"{kind}: its logits are not its output embeddings times the last hidden state (up to a "
                         "known scale or softcap), which drafttree computes them as; this architecture is not "
                         "supported")


def decoder_layers(base: torch.nn.Module) -> torch.nn.ModuleList:
    """A base model's decoder layers wherever its modeling code keeps them (``layers``; GPT-2's and Falcon's ``h``,
    OPT's ``decoder.layers``): the module list as long as the config's layer count."""
    layers = getattr(base, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return layers
    n = getattr(base.config, "num_hidden_layers", None)
    for module in base.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise DraftTreeError(f"cannot find the {n} decoder layers of {type(base).__name__} (features need them)")


def layer_count(model: torch.nn.Module) -> int:
    """How many decoder layers a causal LM's features can be caught at (the module list's length: LongCat-Flash's
    config counts each layer's two attention blocks)."""
    return len(decoder_layers(model.base_model))


def run_with_features(model: torch.nn.Module, feature_layers: list[int] | None, **kw):
    """``model.base_model(**kw)`` with grouped tree attention; with ``feature_layers``, also the inputs of those
    decoder layers side by side ([B, n, k * hidden], caught by forward pre-hooks: no forked modeling code)."""
    base = model.base_model
    with grouped_attention(model), fast_linears(model):
        lean = model_forward(base, feature_layers, kw)  # the same steps without the modeling code's per-call work
        if lean is not None:
            return lean
        return forward_catching(base, feature_layers, **kw)


def forward_catching(base: torch.nn.Module, feature_layers: list[int] | None, **kw):
    """``base(**kw)`` and, with ``feature_layers``, those decoder layers' inputs side by side, caught by forward
    pre-hooks (None without)."""
    if not feature_layers:
        return base(**kw), None
    caught: dict[int, torch.Tensor] = {}
    active = getattr(getattr(base, "config", None), "altup_active_idx", 0)

    def catch(i):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            caught[i] = x[active] if x.dim() == 4 else x  # Gemma 3n's layers pass [streams, B, T, H]: the active
        return hook

    layers = decoder_layers(base)
    handles = [layers[i].register_forward_pre_hook(catch(i), with_kwargs=True) for i in feature_layers]
    try:
        out = base(**kw)
    finally:
        for h in handles:
            h.remove()
    return out, torch.cat([caught[i] for i in feature_layers], dim=-1)


class CommittedPrefix:
    """The tokens the KV cache holds, position by position, with each position's features (what the target handed
    the drafters for it), so that the next prefill can keep the longest common prefix (a chat's earlier turns, a
    shared system prompt) instead of recomputing it: the drafters still see every position's features."""

    def __init__(self):
        self.ids: list[int] = []
        self._feats: torch.Tensor | None = None  # [capacity, F]: rows :len(ids) are the committed positions'
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (tokens, features) of uncommitted forwards

    def __len__(self) -> int:
        return len(self.ids)

    def features(self, n: int) -> torch.Tensor:
        return self._feats[:n]

    def append(self, ids: list[int], feats: torch.Tensor) -> None:
        old = self._feats
        if old is not None and (old.shape[1:] != feats.shape[1:] or old.dtype != feats.dtype
                                or old.device != feats.device):
            # features of another kind (the model moved or re-cast): the positions held so far keep their place but
            # match no token (-1), so nothing before is reused
            self.ids, old = [-1] * len(self.ids), None
        n, need = len(self.ids), len(self.ids) + len(ids)
        if old is None or need > old.shape[0]:
            self._feats = feats.new_zeros(max(need + 64, 2 * need), *feats.shape[1:])
            if n and old is not None:
                self._feats[:n] = old[:n]
        self._feats[n:need] = feats
        self.ids.extend(ids)

    def add_pending(self, tokens: torch.Tensor, feats: torch.Tensor) -> None:
        self._pending.append((tokens.reshape(-1), feats))

    def commit(self, nodes: torch.Tensor) -> None:
        """The pending slots ``nodes`` (indices over every forward since the last commit) join the prefix."""
        tokens = torch.cat([t.to(f.device) for t, f in self._pending])
        feats = torch.cat([f for _, f in self._pending])
        self._pending.clear()
        nodes = nodes.to(feats.device)
        self.append(tokens[nodes].tolist(), feats.index_select(0, nodes))

    def truncate(self, length: int) -> None:
        del self.ids[max(0, length):]
        self._pending.clear()


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class TargetModel:
    """Prefill, tree forward, commit and crop over one sequence (batch size 1).

    ``keep_prefix``: remember what the cache holds (tokens and their features, :class:`CommittedPrefix`) so that
    ``prefill`` keeps the longest prefix it shares with the previous sequence and runs only the rest (prefix
    caching, as llama.cpp's prompt cache and vLLM's automatic prefix caching): the same model, but the reused keys
    were computed by other forwards than a fresh prefill's, so logits may differ from a fresh prefill's in the last
    bits. ``reused`` is how many prompt tokens the last prefill kept."""

    chains_only = False  # a tree of any shape verifies in one forward (chain_target.ChainTarget: chains only)

    def __init__(self, model: torch.nn.Module, feature_layers: list[int] | None = None, keep_prefix: bool = False):
        model = text_only(model)
        check_architecture(model, chains=self.chains_only)
        self.model = model
        self.feature_layers = list(feature_layers) if feature_layers else None
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        self.config = model.config
        # Gemma 2/3's name, RecurrentGemma's
        self.softcap = getattr(self.config, "final_logit_softcapping", None) or getattr(self.config, "logits_soft_cap",
                                                                                        None)
        self.logit_scale = own_logit_scale(model, self.lm_head, self.softcap)  # Cohere's, Granite's; 1.0 for most
        self.layer_types = getattr(self.config, "layer_types", None)
        self.sliding_window = getattr(self.config, "sliding_window", None)
        self.has_sliding = bool(self.layer_types and "sliding_attention" in self.layer_types)
        self.cache: DynamicCache | None = None
        self.length = 0  # tokens committed to the cache
        self._pending = 0  # uncommitted slots (tree or draft round) sitting after `length`
        self._pending_pos = torch.zeros(0, dtype=torch.long)
        self.max_positions = int(getattr(self.config, "max_position_embeddings", 2048) or 2048)
        self.prefix = CommittedPrefix() if keep_prefix else None
        self.reused = 0

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        if features.dtype != self.dtype:  # Mamba's residual in float32 (residual_in_fp32) before a bf16 head
            features = features.to(self.dtype)
        with fast_linears(self.model):
            out = self.lm_head(features)
        if self.logit_scale != 1.0:
            out = out * self.logit_scale
        if self.softcap:
            out = torch.tanh(out.float() / self.softcap) * self.softcap
        return out

    def _new_cache(self) -> DynamicCache:
        # A full (non-sliding) cache for every layer, appending in place: tree slots are addressed by index,
        # and sliding layers get the window through their own mask instead (see `_masks`).
        return GrowingCache()

    def _masks(self, attend: torch.Tensor, positions: torch.Tensor, tail_pos: torch.Tensor):
        full = tree_attention_mask(attend, self.length, self.dtype)
        if not self.has_sliding:
            return full
        sliding = tree_attention_mask(attend, self.length, self.dtype, self.sliding_window, positions, tail_pos)
        return {"full_attention": full, "sliding_attention": sliding}

    def check_prompt(self, n: int) -> None:
        """The one-line error for a prompt of ``n`` tokens that cannot be prefilled."""
        if n == 0:
            raise DraftTreeError("empty prompt: nothing to condition on")
        if n >= self.max_positions:
            raise DraftTreeError(
                f"prompt is {n} tokens but the model's context window is {self.max_positions} tokens"
            )

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, logits_for: str = "last") -> ForwardOutput:
        """Run the prompt on a fresh cache (with ``keep_prefix``: on the longest prefix the cache shares with it,
        only the rest computed; the features cover every prompt position either way). Logits only for the last
        position unless ``logits_for='all'`` (which always runs the whole prompt)."""
        ids = input_ids.reshape(1, -1).to(self.device)
        n = ids.shape[1]
        self.check_prompt(n)
        self.reused = self._reusable(ids[0], n) if logits_for == "last" else 0
        if self.reused:
            return self._prefill_rest(ids, self.reused)
        self.cache = self._new_cache()
        self.length, self._pending = 0, 0
        positions = torch.arange(n, device=self.device)
        mask = None
        if self.has_sliding:
            causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=self.device))
            mask = self._masks(causal, positions, positions)
        out, aux = self._run(
            input_ids=ids, attention_mask=mask, position_ids=positions[None], use_cache=True,
            **{cache_arg(self.base): self.cache},
        )
        feats = out.last_hidden_state[0]
        self.length = n
        features = feats if aux is None else aux
        if self.prefix is not None:
            self.prefix.truncate(0)
            self.prefix.append(ids[0].tolist(), features)
        head_in = feats if logits_for == "all" else feats[-1:]
        return ForwardOutput(logits=self.logits(head_in), features=features)

    # The rest of a prompt runs with a 4-D mask; in bf16 on AVX-512 bf16 its attention is the prompt kernel's (as a
    # fresh prefill's: attention.prompt_rest), elsewhere torch's with that mask, a little dearer per token than a
    # prompt's own path (logs/s61_rest_vs_fresh.py, float32 here: 643 tokens after a 28-token prefix 1.04x a fresh
    # prefill of all 671; bf16 0.90x), so a prefix is kept where the rest is short or the prefix is not a sliver.
    REST_ANYWAY = 128
    REUSE_SHARE = 0.1

    def _reusable(self, ids: torch.Tensor, n: int) -> int:
        """Prompt tokens the cache already holds and that pay to keep (at most n - 1: the last one's logits are
        needed); 0: a fresh prefill."""
        if self.prefix is None or self.cache is None or not len(self.prefix):
            return 0
        held = min([len(self.prefix), self.length] + [layer.get_seq_length() for layer in self.cache.layers])
        p = min(common_prefix(self.prefix.ids[:held], ids[:held].tolist()), n - 1)
        return p if n - p <= self.REST_ANYWAY or p >= self.REUSE_SHARE * n else 0

    def _prefill_rest(self, ids: torch.Tensor, p: int) -> ForwardOutput:
        """The prompt's tokens after the ``p`` already cached, causally over them; then committed."""
        self.crop(p)
        rest = ids[:, p:]
        s = rest.shape[1]
        positions = torch.arange(p, p + s, device=self.device)
        causal = torch.tril(torch.ones(s, s, dtype=torch.bool, device=self.device))
        with prompt_rest(s):  # bf16 on AVX-512 bf16: the prompt kernel, as a fresh prefill's attention
            out, aux = self._run(
                input_ids=rest, attention_mask=self._masks(causal, positions, positions),
                position_ids=positions[None], use_cache=True, **{cache_arg(self.base): self.cache},
            )
        feats = out.last_hidden_state[0]
        features = feats if aux is None else aux
        self.prefix.append(rest[0].tolist(), features)
        self.length = p + s
        # a copy: the prefix's buffer is written again by later prefills, the drafters may keep what they are handed
        return ForwardOutput(logits=self.logits(feats[-1:]), features=self.prefix.features(p + s).clone())

    @torch.inference_mode()
    def forward_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor) -> ForwardOutput:
        """One forward over ``n`` new tokens arranged as a tree on top of the committed cache.

        ``depths[i]`` is node i's distance from the first new token (the root, depth 0), ``ancestors[i, j]``
        is True when node j is node i or one of its ancestors. Node order must be topological.
        """
        self.discard_pending()
        return self.forward_nodes(tokens, depths.to(self.device) + self.length, ancestors)

    @torch.inference_mode()
    def forward_nodes(self, tokens: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor) -> ForwardOutput:
        """Append ``m`` uncommitted slots: each sees the committed past and the pending slots ``attend`` allows.

        ``attend`` is [m, pending + m] over the slots appended since the last commit plus the new ones; a
        drafter grows its tree one depth at a time with this, a verifier calls :meth:`forward_tree`.
        """
        if self.cache is None:
            raise RuntimeError("forward before prefill")
        m = tokens.shape[0]
        positions = positions.to(self.device)
        tail_pos = torch.cat([self._pending_pos, positions]) if self._pending else positions
        out, aux = self._run(
            input_ids=tokens.reshape(1, m).to(self.device),
            attention_mask=self._masks(attend.to(self.device), positions, tail_pos),
            position_ids=positions[None],
            use_cache=True,
            **{cache_arg(self.base): self.cache},
        )
        self._pending += m
        self._pending_pos = tail_pos
        feats = out.last_hidden_state[0]
        features = feats if aux is None else aux
        if self.prefix is not None:
            self.prefix.add_pending(tokens, features)
        return ForwardOutput(logits=self.logits(feats), features=features)

    def _run(self, **kw):
        """The stock forward with grouped-query attention that reads K/V in place (:mod:`drafttree.attention`);
        with ``feature_layers``, forward pre-hooks also catch those layers' inputs."""
        out, aux = run_with_features(self.model, self.feature_layers, **kw)
        return out, None if aux is None else aux[0]

    @torch.inference_mode()
    def commit(self, nodes: list[int] | torch.Tensor) -> None:
        """Keep the tree slots ``nodes`` (a root-to-node path, in order) after the committed past."""
        nodes = torch.as_tensor(nodes, dtype=torch.long, device=self.device)
        m = int(nodes.numel())
        if m > self._pending:
            raise RuntimeError("commit of more slots than the last tree forward produced")
        if self.prefix is not None:
            self.prefix.commit(nodes)
        identity = bool(torch.equal(nodes, torch.arange(m, device=self.device)))
        start = self.length
        if not identity:
            src = nodes + start
            for layer in self.cache.layers:
                layer.keys[:, :, start:start + m] = layer.keys.index_select(2, src)
                layer.values[:, :, start:start + m] = layer.values.index_select(2, src)
        self.length += m
        self.crop(self.length)

    def load_prefix(self, ids: list[int], states: list[tuple[torch.Tensor, torch.Tensor]], features: torch.Tensor,
                    room: int = 0) -> None:
        """Hold these tokens as if they had been prefilled: per-layer keys and values ([heads, len(ids), dim]) and
        their features (copies; ``room``: tokens to make space for). Needs ``keep_prefix``."""
        if self.prefix is None:
            raise RuntimeError("load_prefix needs a TargetModel made with keep_prefix=True")
        n = len(ids)
        self.cache = GrowingCache.of_states([(k[:, :n], v[:, :n]) for k, v in states], room)
        self.length, self._pending = n, 0
        self.prefix = CommittedPrefix()
        self.prefix.append(list(ids), features[:n])

    def keep_prefix(self, on: bool) -> None:
        """Remember what the cache holds from now on (or not): see the class; the cache is dropped either way."""
        self.forget()
        self.prefix = CommittedPrefix() if on else None

    def forget(self) -> None:
        """Drop the cache and what it holds (the next prefill starts from nothing)."""
        self.cache, self.length, self._pending = None, 0, 0
        if self.prefix is not None:
            self.prefix = CommittedPrefix()

    def discard_pending(self) -> None:
        if self._pending:
            self.crop(self.length)

    def crop(self, length: int) -> None:
        """Drop everything after ``length`` cached tokens."""
        for layer in self.cache.layers:
            layer.truncate(length)
        self.length = min(self.length, length)
        self._pending = 0
        if self.prefix is not None:
            self.prefix.truncate(self.length)
