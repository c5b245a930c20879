"""Chains for models that cannot verify a tree: recurrent and hybrid layers, ALiBi.

A layer with a recurrent state (Mamba, gated delta nets, short convolutions: Qwen3.5, Qwen3-Next, LFM2, Jamba,
Falcon-H1, Granite 4 hybrids, ...) folds every token it reads into one state, so the branches of a tree cannot each
see only their own path; ALiBi models build their biases from a 2-D mask. A chain can be verified: one forward of the
model's own (causal) kind over the root and its drafts, on the model's own ``DynamicCache``. What the rejection rule
keeps is a prefix of that chain; when it keeps all of it the cache is already right, and otherwise the state before
the forward is put back (a snapshot taken before it: recurrent states are small and fixed-size, keys and values are
kept by reference) and the kept tokens go in front of the next round's forward, which runs them again at the price of
a few more tokens in a forward whose cost grows slowly with its length here (once ``REPLAY_FLUSH`` have gathered, they
run in a forward of their own). transformers' assisted generation instead records every step's state, which each
model's kernels must support. The decode loop and the acceptance rule are the same as for trees (``decode.py`` asks
any drafter's tree for its first chain, :meth:`DraftTree.first_chain`), so every method stays exact.

transformers' Mamba, Falcon-Mamba and Jamba scans start a multi-token forward from a zero state; their layers record
past states after the prompt (``CHUNKS_DROP_STATE``), which steps a forward's tokens through the scan from the cached
state. Any other model whose forward over several tokens on a cache is not the same function as token by token is
refused in one line at its first prefill, after a check that runs a short random prompt both ways (decisive in float32;
in bf16 its rounding hides all but gross failures).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from drafttree.cache import cache_arg
from drafttree.errors import DraftTreeError
from drafttree.kernels import fast_linears
from drafttree.models import text_only
from drafttree.target import ForwardOutput, TargetModel, forward_catching, recurrent_layers

# transformers' reference scan for these starts every multi-token forward from a zero state ("WRONG if the cache is
# not empty", its own comment): after the prompt, their layers record past states (as its assisted generation does),
# which makes a forward step its tokens through the scan one by one from the cached state
CHUNKS_DROP_STATE = frozenset({"mamba", "falcon_mamba", "jamba"})
# kept tokens waiting to be replayed run in a forward of their own once this many have gathered: a drafter that always
# drafts and rarely has a whole chain accepted would otherwise replay everything since the last such chain each round
REPLAY_FLUSH = 8
UNBOUNDED = 1 << 20  # the context of a model without a position table (Mamba, BLOOM's ALiBi): the memory's limit
KEEP_ALL = 1 << 30  # recurrent states a recording layer keeps per forward: all of them (the chain is short)
# a chunk's logits may differ from token-by-token ones by this share of their spread, and of what the cached prefix
# changes, at most. float32 decides: exact models measured <= 1e-5 / 1e-6 (SmolLM2-135M), scans that drop the cached
# state >= 5e-3 (tiny random Mamba). In bf16 rounding alone reaches 0.18 / 0.018 on SmolLM2, as much as a tiny Mamba's
# dropped state: there only gross failures are caught (models known to drop it record their steps: CHUNKS_DROP_STATE)
CHECK_SPREAD = {torch.float32: 1e-3, None: 1.0}
CHECK_STATE = {torch.float32: 1e-3, None: 0.25}


def target_for(model: torch.nn.Module, feature_layers: list[int] | None = None,
               keep_prefix: bool = False) -> TargetModel:
    """The verifier for ``model``: trees where its layers take them, chains (:class:`ChainTarget`) for recurrent layers
    and ALiBi (attention of other kinds, judged on no model yet, keeps the tree target's one-line refusal)."""
    model = text_only(model)
    if recurrent_layers(model) is not None or _alibi(model):
        return ChainTarget(model, feature_layers)
    return TargetModel(model, feature_layers, keep_prefix)


def _alibi(model: torch.nn.Module) -> bool:
    cfg = model.config
    return bool(getattr(cfg, "alibi", False)) or getattr(cfg, "model_type", None) in ("bloom", "mpt")


def _state(obj, skip: tuple[str, ...] = ()) -> dict:
    """What ``obj`` (a cache or one of its layers) holds, to be put back: tensors updated in place (recurrent and
    convolution states in dicts, 0-d counters) copied; keys and values, which an update replaces, by reference."""
    out = {}
    for name, value in vars(obj).items():
        if name in skip:
            continue
        if isinstance(value, torch.Tensor):
            out[name] = value.clone() if value.dim() == 0 else value
        elif isinstance(value, dict):
            out[name] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in value.items()}
        elif isinstance(value, list):
            out[name] = list(value)
        else:
            out[name] = value
    return out


def _put_back(obj, state: dict) -> None:
    for name in [n for n in vars(obj) if n not in state and n != "layers"]:
        delattr(obj, name)
    vars(obj).update(state)


class ChainTarget(TargetModel):
    """Prefill, chain forward, commit over one sequence of a model that verifies chains only (module docstring).

    ``length`` counts the tokens committed; the cache holds the state of ``length - len(replay)`` of them, the
    ``replay`` tokens running at the head of the next forward."""

    chains_only = True

    def __init__(self, model: torch.nn.Module, feature_layers: list[int] | None = None):
        super().__init__(model, feature_layers, keep_prefix=False)
        self.steps = getattr(model.config, "model_type", None) in CHUNKS_DROP_STATE
        if not getattr(self.config, "max_position_embeddings", None):  # MPT's max_seq_len, or none at all
            self.max_positions = int(getattr(self.config, "max_seq_len", 0) or UNBOUNDED)
        self.replay: list[int] = []
        self._snapshot: tuple[dict, list[dict]] | None = None
        self._chain: list[int] = []
        self._checked = False

    def _new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def _run(self, **kw):
        """The model's own forward (its own causal masks), with the feature layers' inputs caught by pre-hooks."""
        try:
            with fast_linears(self.model):
                out, aux = forward_catching(self.base, self.feature_layers, **kw)
        except ValueError as e:  # e.g. MiniMax: "uses cache of its own and is not compatible with ... DynamicCache"
            if "cache" in str(e):
                kind = getattr(self.config, "model_type", type(self.model).__name__)
                raise DraftTreeError(f"{kind}: its forward does not take transformers' DynamicCache, which drafttree "
                                     "rolls back between chains; this architecture is not supported") from e
            raise
        return out, None if aux is None else aux[0]

    def _forward(self, ids: list[int] | torch.Tensor, start: int):
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.device).reshape(1, -1)
        positions = torch.arange(start, start + ids.shape[1], device=self.device)
        return self._run(input_ids=ids, position_ids=positions[None], use_cache=True,
                         **{cache_arg(self.base): self.cache})

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, logits_for: str = "last") -> ForwardOutput:
        ids = input_ids.reshape(-1).to(self.device)
        n = ids.numel()
        self.check_prompt(n)
        if not self._checked:
            self._check_chunks()
        self.cache = self._new_cache()
        self.length, self._pending, self.replay, self._snapshot, self.reused = 0, 0, [], None, 0
        out, aux = self._forward(ids, 0)
        self._record(self.cache)
        feats = out.last_hidden_state[0]
        self.length = n
        head_in = feats if logits_for == "all" else feats[-1:]
        return ForwardOutput(logits=self.logits(head_in), features=feats if aux is None else aux)

    def _check_chunks(self, prefix: int = 16, chunk: int = 8) -> None:
        """Refuse, in one line, a model whose forward over several tokens on a cache differs from token by token: by
        more than ``CHECK_SPREAD`` of the logits' spread, or more than ``CHECK_STATE`` of what the cached prefix
        changes (the same tokens on an empty cache)."""
        g = torch.Generator().manual_seed(0)
        n = prefix + chunk
        ids = torch.randint(0, self.lm_head.weight.shape[0], (n,), generator=g).tolist()

        def logits_of(ids_run, start):
            return self.logits(self._forward(ids_run, start)[0].last_hidden_state[0]).float()

        self.cache = self._new_cache()
        self._forward(ids[:prefix], 0)
        self._record(self.cache)
        chunked = logits_of(ids[prefix:], prefix)
        self.cache = self._new_cache()
        self._forward(ids[:prefix], 0)
        self._record(self.cache)
        steps = torch.cat([logits_of(ids[i:i + 1], i) for i in range(prefix, n)])
        self.cache = self._new_cache()
        fresh = logits_of(ids[prefix:], prefix)
        self.cache = None
        off = (chunked - steps).abs().max()
        spread = CHECK_SPREAD.get(self.dtype, CHECK_SPREAD[None])
        state = CHECK_STATE.get(self.dtype, CHECK_STATE[None])
        if off > spread * steps.std() or off > state * (steps - fresh).abs().max():
            kind = getattr(self.config, "model_type", type(self.model).__name__)
            raise DraftTreeError(f"{kind}: its forward over several tokens on a cache does not give what it gives "
                                 "token by token, which verifying a chain needs; this architecture is not supported")
        self._checked = True

    @torch.inference_mode()
    def forward_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor) -> ForwardOutput:
        """The chain ``tokens`` (depths 0, 1, 2, ...) after the committed tokens, the replayed ones first."""
        if self.cache is None:
            raise RuntimeError("forward before prefill")
        n = int(tokens.numel())
        if not torch.equal(depths.cpu(), torch.arange(n)):
            raise RuntimeError("a chain target verifies chains only (DraftTree.first_chain)")
        self.discard_pending()
        self._snapshot = (_state(self.cache, ("layers",)), [_state(layer) for layer in self.cache.layers])
        self._chain = tokens.reshape(-1).tolist()
        done = self.length - len(self.replay)
        out, aux = self._forward(self.replay + self._chain, done)
        feats = out.last_hidden_state[0, len(self.replay):]
        features = feats if aux is None else aux[len(self.replay):]
        self._pending = n
        return ForwardOutput(logits=self.logits(feats), features=features)

    def forward_nodes(self, tokens: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor) -> ForwardOutput:
        raise DraftTreeError("a model with recurrent layers verifies chains only; it cannot grow a draft tree itself")

    @torch.inference_mode()
    def commit(self, nodes: list[int] | torch.Tensor) -> None:
        """Keep the chain's first ``len(nodes)`` tokens: all of them as the cache holds them, fewer by putting the
        state of before the forward back and replaying them next round."""
        m = len(nodes) if isinstance(nodes, list) else int(nodes.numel())
        if m > self._pending or not torch.equal(torch.as_tensor(nodes).cpu(), torch.arange(m)):
            raise RuntimeError("commit of a chain's first tokens only, as many as the last forward ran at most")
        if m == self._pending:
            self.replay = []
            self._trim()
        else:
            self._restore()
            self.replay = self.replay + self._chain[:m]
        self.length += m
        self._pending, self._snapshot = 0, None
        if len(self.replay) >= REPLAY_FLUSH:
            self._forward(self.replay, self.length - len(self.replay))
            self.replay = []
            self._trim()

    def _restore(self) -> None:
        top, layers = self._snapshot
        _put_back(self.cache, top)
        for layer, state in zip(self.cache.layers, layers):
            _put_back(layer, state)
        self._trim()

    def _record(self, cache) -> None:
        """Layers that record past states (``steps``): from now on a forward steps through the scan token by token."""
        if self.steps:
            for layer in cache.layers:
                if hasattr(layer, "activate_past_recording"):
                    layer.activate_past_recording(recurrent_states_to_keep=KEEP_ALL)

    def _trim(self) -> None:
        """A recording layer's convolution states back to the kernel's width and its recorded states dropped (kept
        after a forward, they would grow with every round)."""
        if self.steps:
            for layer in self.cache.layers:
                if getattr(layer, "record_past", False):
                    layer.crop(0)

    def discard_pending(self) -> None:
        if self._pending:
            self._restore()
            self._pending, self._snapshot = 0, None

    def crop(self, length: int) -> None:
        if length != self.length:
            raise DraftTreeError("a model with recurrent layers cannot drop committed tokens from its state")
        self.discard_pending()

    def load_prefix(self, *args, **kwargs) -> None:
        raise DraftTreeError("a model with recurrent layers keeps no prefix cache")

    def keep_prefix(self, on: bool) -> None:
        self.forget()

    def forget(self) -> None:
        self.cache, self.length, self._pending, self.replay, self._snapshot = None, 0, 0, [], None
