"""Classic speculative decoding with a small draft language model sharing the target's tokenizer.

The draft proposes its greedy chain, or with ``tree=True`` an EAGLE-2-style top-k tree. At T > 0 both are grown
from the draft's distribution seen through the target's noise (:mod:`drafttree.noise`): its top-1 is its own sample
under that noise, which is the target's sample whenever the two agree (the coupling that replaces Leviathan et al.'s
min(1, p/q) test; the verifier's rule keeps the output the target's, whatever was drafted).
The draft LM runs through the same :class:`~drafttree.target.TargetModel` wrapper as the target, so it
can draft trees with tree attention too.
"""

from __future__ import annotations

import torch

from drafttree.budget import BudgetRounds
from drafttree.drafters.base import Drafter, DraftRequest
from drafttree.drafters.options import AUTO, DraftLMOptions
from drafttree.errors import DraftTreeError
from drafttree.live_curve import LiveCurve
from drafttree.noise import coupled
from drafttree.target import TargetModel, common_prefix
from drafttree.tree import DraftTree, grow_chain, grow_dynamic_tree

# positions a draft round may need past the draft's committed cache (its deepest tree, with room to spare)
DRAFT_HEADROOM = 64


def param_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


class _DraftLMStepper:
    """TreeStepper over a draft LM whose committed cache holds the context up to and including the root."""

    vocab_ids = None

    def __init__(self, lm: TargetModel, root_lp: torch.Tensor, vocab: int):
        self.lm, self._root_lp, self.vocab = lm, root_lp, vocab

    def root_logprobs(self) -> torch.Tensor:
        return self._root_lp

    def expand(self, tokens, parent_slots, attend, depth):
        positions = torch.full((tokens.shape[0],), self.lm.length - 1 + depth, dtype=torch.long)
        out = self.lm.forward_nodes(tokens, positions, attend)
        return torch.log_softmax(out.logits[:, : self.vocab].float(), dim=-1)


class DraftLMState:
    """The draft LM's own KV cache, kept in step with the context lazily (only when it drafts). Between
    generations it can keep what it holds (``keep_prefix``, with the target's ``prefix_cache``): a new context
    that begins the same way (a chat's earlier turns, a shared system prompt) is fed from where they part. Only
    proposals come from it, so this changes what is drafted at most in the last bits, never what is generated.

    Its distribution covers the ids both vocabularies share (``min`` of the two output sizes): a draft with
    fewer rows than the target (Qwen2.5-0.5B: 151,936 vs 152,064) never proposes the ids it lacks.

    ``window`` (per catch-up): a fresh prefill reads only the context's last ``window`` tokens (0: all of it). A
    draft LM's prefill of a long prompt is paid before its first draft, and on a CPU, where prefill is compute-bound,
    a 0.5B draft reads a 1,600-token prompt in about a third of the 1.5B target's prefill time: more than its drafts
    of a short answer save (docs/benchmark-notes.md, stop 82). The context's n-grams still see the whole prompt. A
    draft whose own context window is shorter than the target's starts again from the context's last tokens when it
    fills up.
    """

    def __init__(self, draft_model: torch.nn.Module, target_vocab: int):
        self.lm = TargetModel(draft_model)
        self.rows = self.lm.model.get_input_embeddings().weight.shape[0]
        self.vocab = min(target_vocab, self.lm.lm_head.weight.shape[0])
        self.fed = 0  # context tokens held (or skipped, before the window) by the draft's committed cache
        self.start = 0  # the context position of the cache's first token
        self.keep_prefix = False  # keep the cache for the next generation's context (else a fresh prefill)

    def reset(self) -> None:
        """A new generation: the next catch-up prefills its context (with ``keep_prefix``, only from where it
        parts from what the cache holds)."""
        self.fed = 0
        if not self.keep_prefix:
            self.lm.cache = None

    def keep(self, on: bool) -> None:
        """Keep the cache between generations from now on (or not); what it holds now is dropped."""
        self.keep_prefix = bool(on)
        self.lm.keep_prefix(self.keep_prefix)
        self.fed = 0

    def _ids(self, tokens: list[int]) -> torch.Tensor:
        """Token ids the draft has no embedding for (the target's extra rows) are read as id 0."""
        ids = torch.tensor(tokens, dtype=torch.long)
        return ids.masked_fill(ids >= self.rows, 0)

    def _fresh_start(self, context: list[int], window: int) -> int:
        """Where a fresh prefill of ``context`` starts: the window's start, never so far back that the draft's own
        context window could not hold it and a round's draft slots; with ``keep_prefix``, where the cache's tokens
        start when extending them costs no more than a fresh window (a chat's next turn)."""
        n = len(context)
        room = max(1, self.lm.max_positions - DRAFT_HEADROOM)
        keep = min(n, max(0, int(window)) or n, room)
        if self.keep_prefix and self.lm.prefix is not None and self.lm.cache is not None and self.start < n \
                and n - self.start <= room:
            held = common_prefix(self.lm.prefix.ids, context[self.start:])
            if n - self.start - held <= keep:
                return self.start
        return n - keep

    @torch.inference_mode()
    def catch_up(self, context: list[int], window: int = 0) -> torch.Tensor:
        """Feed the context tokens the draft has not seen; log-probs of the token after the last one. ``window``:
        how many of the context's last tokens a fresh prefill reads (0: all)."""
        fresh = self.lm.cache is None or self.fed == 0 or self.fed > len(context)
        if not fresh and self.lm.length + len(context) - self.fed + DRAFT_HEADROOM > self.lm.max_positions:
            fresh = True  # the draft's own context window is full: start again from the context's last tokens
        if fresh:
            self.start = self._fresh_start(context, window)
            out = self.lm.prefill(self._ids(context[self.start:]))
        else:
            self.lm.discard_pending()
            new = context[self.fed:]
            n = len(new)
            positions = torch.arange(self.lm.length, self.lm.length + n)
            causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
            out = self.lm.forward_nodes(self._ids(new), positions, causal)
            self.lm.commit(list(range(n)))
        self.fed = len(context)
        return torch.log_softmax(out.logits[-1, : self.vocab].float(), dim=-1)

    def stepper(self, context: list[int], window: int = 0) -> _DraftLMStepper:
        return _DraftLMStepper(self.lm, self.catch_up(context, window), self.vocab)


class DraftModelDrafter(Drafter):
    name = "draft"

    def __init__(self, draft_model: torch.nn.Module, vocab_size: int, k: int = 4, tree: bool = False,
                 top_k: int = 4, total_tokens: int = 16, budget=None, live_curve: bool = False, window: int = 0):
        """``budget``: a TreeBudget sizing each tree (trees only); else ``total_tokens`` nodes are verified;
        ``window``: the draft reads at most the context's last that many tokens (:class:`DraftLMState`)."""
        if int(k) <= 0:
            raise DraftTreeError(f"draft length must be > 0, got {k}")
        self.state = DraftLMState(draft_model, vocab_size)
        self.window = int(window)
        self.k, self.tree, self.top_k = int(k), tree, int(top_k)
        self.total_tokens = int(total_tokens)
        live = LiveCurve(budget.cost) if budget is not None and tree and live_curve else None
        self.rounds = BudgetRounds(budget, live) if budget is not None and tree else None

    def keep_prefix(self, on: bool) -> None:
        self.state.keep(on)

    def begin(self, prompt, prefill_features, root):
        self.state.reset()
        if self.rounds is not None:
            self.rounds.begin()

    def verified(self, tokens: int, context: int, seconds: float) -> None:
        if self.rounds is not None:
            self.rounds.verified(tokens, context, seconds)

    def observe(self, committed, features, next_root):
        if self.rounds is not None:
            self.rounds.observe(len(committed) - 1)

    @torch.inference_mode()
    def propose(self, req: DraftRequest) -> DraftTree:
        k = min(self.k, req.max_depth)
        if k <= 0:
            return DraftTree.root_only(req.root)
        stepper = coupled(self.state.stepper(req.context, self.window), req.sampling, req.noise, req.root_pos)
        if self.tree:  # deterministic top-k tree: point-mass candidates at any temperature
            if self.rounds is None:
                return grow_dynamic_tree(stepper, req.root, k, self.top_k, self.total_tokens)
            budget = self.rounds.start(req.cost, len(req.context))
            tree = grow_dynamic_tree(stepper, req.root, k, self.top_k, budget.max_total, budget=budget)
            if req.chain:  # verified as its best chain (chain_target.py): the budget learns from that
                tree = tree.first_chain()
            self.rounds.record(budget, tree.expected_accept or 0.0, tree.size)
            req.info.update(tree_tokens=tree.size, depth=tree.max_depth)
            return tree
        return grow_chain(stepper, req.root, k)


def make_draft_drafter(target, draft, o: DraftLMOptions) -> DraftModelDrafter:
    """``target``/``draft`` are LoadedModels; a tree with ``total_tokens='auto'`` is sized by this machine's
    verify-cost curve."""
    from drafttree.drafters.eagle import make_budget

    budget = make_budget(target, max_total=o.max_total) if o.tree and o.total_tokens == AUTO else None
    total = 16 if o.total_tokens == AUTO else o.total_tokens
    return DraftModelDrafter(draft.model, target.vocab_size, k=o.depth, tree=o.tree, top_k=o.top_k,
                             total_tokens=total, budget=budget, live_curve=o.live_curve, window=o.window)
