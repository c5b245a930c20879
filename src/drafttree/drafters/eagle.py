"""EAGLE drafting with a trained head: a drafter = the head's state + a shape (chain, EAGLE-1 static tree,
EAGLE-2 dynamic tree) + a length policy (fixed, confidence threshold, AdaEAGLE LDLP); methods compose them.

The head keeps its own KV cache of *committed* pairs (target feature at t, token t+1). Each round it
re-encodes the pairs the target just accepted with the target's true features (``observe``), whose last
output is the predicted feature of the new root; drafting then appends uncommitted tree slots, which
the next ``observe`` drops, so drafting branches never pollute the committed cache.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import torch

from drafttree.attention import MAX_FOLDED_QUERY, grouped_attention, prompt_rest
from drafttree.budget import BudgetRounds, TreeBudget, check_prune_rule, cost_model_for
from drafttree.cache import GrowingCache
from drafttree.drafters.assistant import AssistantState
from drafttree.drafters.base import Drafter, DraftRequest
from drafttree.drafters.dflash import DFlashState
from drafttree.drafters.length_policies import (
    ConfidenceStop,
    FixedLength,
    LastToken,
    LengthPolicy,
    LengthPredictor,
    PredictedLength,
    PredictedLengthAndConfidence,
    StopRule,
)
from drafttree.drafters.options import AUTO, EagleOptions, parse_options
from drafttree.errors import DraftTreeError
from drafttree.heads.model import EagleHead
from drafttree.kernels import fast_linears
from drafttree.live_curve import LiveCurve
from drafttree.noise import coupled
from drafttree.target import tree_attention_mask
from drafttree.tree import (
    EAGLE1_TREE,
    DraftTree,
    grow_chain,
    grow_dynamic_tree,
    grow_static_tree,
)


class HeadInput(NamedTuple):
    """One head forward's inputs for one sequence: features at t, tokens t+1, positions, and which of its
    uncommitted slots (those drafted this round, then these) each token attends to."""

    feats: torch.Tensor
    ids: torch.Tensor
    positions: torch.Tensor
    attend: torch.Tensor


class EagleState:
    """The head's cache, committed length and the predicted feature of the current root (a TreeStepper)."""

    def __init__(self, head: EagleHead):
        self.head = head
        self.vocab_ids = head.draft_vocab.to(head.fc.weight.device) if head.draft_vocab is not None else None
        self.cache: GrowingCache | None = None  # appends in place; drafted slots are cropped, not copied
        self.committed = 0
        self.pending = 0
        self.root_pos = 0
        self.root_feat: torch.Tensor | None = None
        self._root_lp: torch.Tensor | None = None
        self.slot_feats: list[torch.Tensor] = []  # predicted features of this round's expanded slots
        self._queued: list[tuple[torch.Tensor, list[int], int]] = []  # committed pairs not yet encoded

    def _run(self, feats: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor,
             committed: bool = False):
        """One head forward; ``committed``: the queued pairs (causal, over every cached pair), which a long prompt makes
        a prefill: it attends as one (the prompt kernel, or torch's causal kernel, not a masked SDPA over n x n: 77 of
        the 145 ms a 2,000-token prompt's pairs took, the head's largest cost on long prompts)."""
        n = int(ids.shape[0])
        prefill = (committed and n > MAX_FOLDED_QUERY and not getattr(self.head, "sliding_window", None)
                   and getattr(getattr(self.head, "config", None), "_attn_implementation", None) == "sdpa")
        # an empty cache: causal over its own keys, what a prefill's attention does without a mask
        mask = None if prefill and self.committed == 0 else self.mask(attend, positions)
        # several draft nodes at once: K/V read in place
        with grouped_attention(self.head), fast_linears(self.head), prompt_rest(n) if prefill else nullcontext():
            out = self.head(feats[None], ids[None], positions[None], mask, self.cache)
        return out[0]

    def _crop(self) -> None:
        if self.pending:
            for layer in self.cache.layers:
                layer.truncate(self.committed)
            self.pending = 0
        self.slot_feats = []

    @torch.inference_mode()
    def encode(self, feats: torch.Tensor, next_ids: list[int], start: int) -> None:
        """Commit true pairs (feature t, token t+1) for positions start.. and predict the next root feature.

        Deferred until the head drafts again: rounds that do not draft (a gated source, a batch verifying
        roots only) cost no head forward, and the pairs of several rounds are encoded in one."""
        if self._queued and self._queued[-1][2] + len(self._queued[-1][1]) != start:
            self.flush()
        self._queued.append((feats, list(next_ids), start))
        self.root_pos = start + len(next_ids)
        self._root_lp = None

    @property
    def queued_pairs(self) -> int:
        """Committed pairs waiting to be encoded (the next draft's first forward encodes them)."""
        return sum(len(chunk) for _, chunk, _ in self._queued)

    @torch.inference_mode()
    def flush(self) -> None:
        """Encode the queued committed pairs now (drafting calls this first)."""
        inp = self.flush_input()
        if inp is not None:
            self.flush_output(self._run(*inp, committed=True))

    def flush_input(self) -> HeadInput | None:
        """The head forward that encodes the queued pairs (run it alone or packed with other rows', then pass its
        output to :meth:`flush_output`); None when nothing is queued."""
        if not self._queued:
            return None
        if self.cache is None:
            self.cache = GrowingCache()
        self._crop()
        dev = self.head.fc.weight.device
        feats = torch.cat([f.to(dev) for f, _, _ in self._queued])
        ids = [t for _, chunk, _ in self._queued for t in chunk]
        start = self._queued[0][2]
        n = len(ids)
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=dev))
        return HeadInput(feats, torch.tensor(ids, device=dev), torch.arange(start, start + n, device=dev), causal)

    def flush_output(self, out: torch.Tensor) -> None:
        self.committed += sum(len(chunk) for _, chunk, _ in self._queued)
        self._queued = []
        self.root_feat = out[-1]

    def mask(self, attend: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """The additive mask of a head forward over the committed cache plus the slots ``attend`` covers; a head with
        a ``sliding_window`` (Mellum's MTP layer) does not see keys that far behind the query ``positions`` (this
        round's earlier slots are a tree's depth away: inside any window a model uses, so always seen)."""
        dtype = self.head.fc.weight.dtype
        window = getattr(self.head, "sliding_window", None)
        if not window or positions is None:
            return tree_attention_mask(attend, self.committed, dtype)
        positions = positions.to(attend.device)
        m, s = attend.shape
        tail = torch.cat([positions.min().expand(s - m), positions])
        return tree_attention_mask(attend, self.committed, dtype, window, query_pos=positions, tail_pos=tail)

    # -- TreeStepper -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def root_logprobs(self) -> torch.Tensor:
        self.flush()
        if self._root_lp is None:
            self._root_lp = torch.log_softmax(self.head.draft_logits(self.root_feat).float(), dim=-1)
        return self._root_lp

    @torch.inference_mode()
    def expand(self, tokens: torch.Tensor, parent_slots: torch.Tensor, attend: torch.Tensor, depth: int):
        self.flush()
        out = self._run(*self.expand_input(tokens, parent_slots, attend, depth))
        return torch.log_softmax(self.head.draft_logits(self.expand_output(out)).float(), dim=-1)

    def expand_input(self, tokens: torch.Tensor, parent_slots: torch.Tensor, attend: torch.Tensor,
                     depth: int) -> HeadInput:
        """The head forward of one expansion (after :meth:`flush`); its output goes to :meth:`expand_output`."""
        feats = torch.stack([self.root_feat if s < 0 else self.slot_feats[s] for s in parent_slots.tolist()])
        pos = torch.full((tokens.numel(),), self.root_pos + depth - 1, dtype=torch.long, device=feats.device)
        return HeadInput(feats, tokens.to(feats.device), pos, attend)

    def expand_output(self, out: torch.Tensor) -> torch.Tensor:
        """Record an expansion's predicted features (new pending slots); returns them for the draft logits."""
        self.pending += out.shape[0]
        self.slot_feats.extend(out.unbind(0))
        return out


def state_for(head) -> EagleState | AssistantState | DFlashState:
    """The tree stepper of ``head``: an EAGLE head's cached state, a Gemma 4 assistant's (no cache of its own) or a
    DFlash drafter's (one forward per round drafts every depth)."""
    kind = getattr(head, "kind", "eagle")
    if kind == "assistant":
        return AssistantState(head)
    return DFlashState(head) if kind == "dflash" else EagleState(head)


# -- shapes: how a round's draft grows from the head ----------------------------------------------------------


class ChainShape:
    """The head's top-1 chain (the policy may stop it early); at T > 0 its top-1 under the target's noise."""

    chain = True

    def begin(self) -> None:
        pass

    def grow(self, drafter: EagleDrafter, req: DraftRequest, depth: int, stop: StopRule | None) -> DraftTree:
        tree = grow_chain(coupled(drafter.state, req.sampling, req.noise, req.root_pos), req.root, depth, stop=stop)
        req.info["drafted"] = tree.size - 1
        return tree

    def observe(self, accepted_drafts: int) -> None:
        pass


class StaticTreeShape:
    """The EAGLE-1 static tree (paths of child ranks), cut at the round's depth."""

    chain = False

    def __init__(self, paths: list[list[int]] | None = None):
        self.paths = paths or EAGLE1_TREE

    def begin(self) -> None:
        pass

    def grow(self, drafter, req, depth, stop):
        stepper = coupled(drafter.state, req.sampling, req.noise, req.root_pos)
        return grow_static_tree(stepper, req.root, [p for p in self.paths if len(p) <= depth])

    def observe(self, accepted_drafts: int) -> None:
        pass


class DynamicTreeShape:
    """EAGLE-2: expand the ``top_k`` most confident nodes per level, verify the best ``total_tokens``, or
    as many as this machine's verify-cost curve says pay (``budget``)."""

    chain = False

    def __init__(self, top_k: int = 8, total_tokens: int | None = None, budget: TreeBudget | None = None,
                 live_curve: bool = False):
        if budget is None and total_tokens is None:
            raise DraftTreeError("an EAGLE-2 tree needs total_tokens or a TreeBudget")
        self.top_k, self.total_tokens = int(top_k), total_tokens
        live = LiveCurve(budget.cost) if budget is not None and live_curve else None
        self.rounds = BudgetRounds(budget, live) if budget is not None else None

    def begin(self) -> None:
        if self.rounds is not None:
            self.rounds.begin()

    def grow(self, drafter, req, depth, stop):
        stepper = coupled(drafter.state, req.sampling, req.noise, req.root_pos)
        if self.rounds is None:
            return grow_dynamic_tree(stepper, req.root, depth, self.top_k, self.total_tokens)
        budget = self.rounds.start(req.cost, len(req.context))
        tree = grow_dynamic_tree(stepper, req.root, depth, self.top_k, budget.max_total, budget=budget)
        if req.chain:  # verified as its best chain (chain_target.py): the budget learns from that
            tree = tree.first_chain()
        self.rounds.record(budget, tree.expected_accept or 0.0, tree.size)
        req.info.update(tree_tokens=tree.size, depth=tree.max_depth, calibration=round(budget.calibration, 3))
        return tree

    def observe(self, accepted_drafts: int) -> None:
        if self.rounds is not None:
            self.rounds.observe(accepted_drafts)


class EagleDrafter(Drafter):
    """An EAGLE head drafting a ``shape`` (chain, static or dynamic tree) as deep as a ``length`` policy says."""

    def __init__(self, head: EagleHead, shape, length: LengthPolicy, name: str = "eagle"):
        self.head, self.shape, self.length, self.name = head, shape, length, name
        self.state = state_for(head)
        self._last: LastToken | None = None  # (token, feature) of the last token the target validated

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        self.state = state_for(self.head)
        self.shape.begin()
        ids = prompt.reshape(-1).tolist()
        self._last = (ids[-1], prefill_features[-1])
        self.state.encode(prefill_features, ids[1:] + [root], 0)

    def propose(self, req: DraftRequest) -> DraftTree:
        depth, stop = self.length.plan(req, self._last, self.shape.chain)
        depth = min(depth, req.max_depth, getattr(self.state, "max_depth", depth))  # DFlash: one block deep
        if depth <= 0:
            return DraftTree.root_only(req.root)
        if isinstance(self.state, AssistantState):
            self.state.attach(req.target)
        return self.shape.grow(self, req, depth, stop)

    def verified(self, tokens: int, context: int, seconds: float) -> None:
        rounds = getattr(self.shape, "rounds", None)
        if rounds is not None:
            rounds.verified(tokens, context, seconds)

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        self.shape.observe(len(committed) - 1)
        self._last = (committed[-1], features[-1])
        self.state.encode(features, committed[1:] + [next_root], self.state.root_pos)


# -- methods: a shape and a length policy each ---------------------------------------------------------------


def make_budget(target, max_total: int = 64, min_total: int = 2, prune_against: str = "best") -> TreeBudget:
    """A TreeBudget with this machine's verify-cost curve for ``target`` (measured on first use, then cached)."""
    from drafttree.chain_target import target_for

    return TreeBudget(cost_model_for(target_for(target.model), target.name), max_total=max_total,
                      min_total=min_total, prune_against=prune_against)


CHAIN_MAX = 8  # k_max of the adaptive chain policies


def _predictor(head: EagleHead, o: EagleOptions) -> LengthPredictor:
    if getattr(head, "kind", "eagle") != "eagle":
        kind = {"assistant": "Gemma 4 assistant", "dflash": "DFlash drafter"}.get(head.kind, "EAGLE-3 head")
        raise DraftTreeError("the AdaEAGLE length predictor reads the target's last hidden state: it works with "
                             f"EAGLE-1/2 heads, not with this {kind}")
    if o.ldlp is not None:
        return LengthPredictor(head, o.ldlp)
    from drafttree.heads.length import load_length_predictor

    path = getattr(head, "path", None)
    if path is None:
        raise DraftTreeError("this head has no length predictor (LDLP) next to it; train one with "
                             "`drafttree train-length`")
    return LengthPredictor(head, load_length_predictor(path, head.config.hidden_size))


def _dynamic(target, o: EagleOptions) -> DynamicTreeShape:
    if o.total_tokens == AUTO:
        return DynamicTreeShape(o.top_k, budget=make_budget(target, max_total=o.max_total,
                                                            prune_against=o.prune_against), live_curve=o.live_curve)
    return DynamicTreeShape(o.top_k, total_tokens=o.total_tokens)


def _block_depth(head) -> int:
    """A DFlash drafter's whole block, as its paper verifies it; other heads refuse the method in one line."""
    if getattr(head, "kind", "eagle") != "dflash":
        raise DraftTreeError("method 'dflash' drafts with a DFlash drafter (--head DIR of a DFlashDraftModel); this "
                             "head is not one: use eagle-chain")
    return head.block_size - 1


EAGLE_METHODS = {  # method -> (shape, length policy) built from the options
    "eagle-chain": lambda t, h, o: (ChainShape(), FixedLength(o.depth or 4)),
    "dflash": lambda t, h, o: (ChainShape(), FixedLength(o.depth or _block_depth(h))),
    "eagle1": lambda t, h, o: (StaticTreeShape(o.tree), FixedLength(o.depth or 5)),
    "eagle2": lambda t, h, o: (_dynamic(t, o), FixedLength(o.depth or 8)),
    "eagle2-ldlp": lambda t, h, o: (_dynamic(t, o), PredictedLength(_predictor(h, o), o.depth_slack)),
    "eagle-chain-threshold": lambda t, h, o: (ChainShape(), ConfidenceStop(o.depth or CHAIN_MAX, o.threshold)),
    "eagle-chain-ldlp": lambda t, h, o: (ChainShape(), PredictedLength(_predictor(h, o))),
    "eagle-chain-ldlp-threshold": lambda t, h, o: (
        ChainShape(), PredictedLengthAndConfidence(_predictor(h, o), o.depth or CHAIN_MAX, o.threshold)),
}


def make_eagle_drafter(method: str, target, head: EagleHead, options: EagleOptions | dict | None = None,
                       **kw) -> EagleDrafter:
    """EAGLE drafters by method name; ``options`` (or keywords) override the method's defaults."""
    if method not in EAGLE_METHODS:
        raise DraftTreeError(f"unknown EAGLE method {method!r}; choose one of {', '.join(EAGLE_METHODS)}")
    o = options if isinstance(options, EagleOptions) else parse_options(EagleOptions, method, {**(options or {}),
                                                                                              **kw})
    check_prune_rule(o.prune_against)
    shape, length = EAGLE_METHODS[method](target, head, o)
    return EagleDrafter(head, shape, length, name=method)
