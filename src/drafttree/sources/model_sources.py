"""Candidate sources backed by a model: an EAGLE head and a small draft LM.

Both expand EAGLE-2 style (:func:`~drafttree.tree.expand_candidates`): the ``top_k`` best frontier nodes per
depth, their ``top_k`` children each. The drafter's probability of a token goes through a calibration
table (probability bin x depth) learned online, so a weak head's 0.9 is read as what it is worth for this
target. A level is drafted only while the frontier's expected accepted tokens pay for one more drafter
call and the nodes it adds, against the best tree the round could verify now (costs in units of one target
forward, from parameter counts and the verify-cost curve, times how much longer than that the drafter measured a
level to take here: never less than modelled).
The head's cache is synced lazily: rounds in which it does not draft only queue the target's features.
"""

from __future__ import annotations

import math
import time

import torch

from drafttree.budget import best_tree, joining
from drafttree.noise import coupled
from drafttree.sources.base import Calibration, Proposal, RoundContext
from drafttree.tree import Candidates

PROB_EDGES = torch.tensor([0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.97])
DEPTHS = 4  # depth buckets 1, 2, 3, 4+
# a level's rate when deciding to draft it may read this many standard errors high (Calibration.level_rate, option
# ``explore``): without it one early miss at a level the source seldom reaches kept a 0.5B draft LM at two levels for a
# whole generation (HumanEval #12 at L, stop 48: depth-3 rate 0.65 from 1 test, where its chains of 4 are all accepted
# in 75% of rounds). Off by default: with 1.0, side by side, L 1.24x vs 1.25x the better single source, S T=0 1.31x vs
# 1.29x `ar`, S T=1 1.04x vs 1.06x `ar` (more drafting where rates are low): no gain measured (docs/benchmark-notes.md)
EXPLORE = 0.0
EXTEND_MIN = 0.3  # a draft LM drafts on after another source's branch only while that branch is this likely
# a draft LM's fresh prefill may take this share of the time plain decoding would take for the rest of the answer
# (DraftLMSource.prefill_window); at L on a CPU its full prefill of 1,500-2,000-token prompts cost more than its drafts
# saved (stop 82: 0.92x our `ar` at T=1 on long prompts, against 1.00x reading the last 512 tokens)
PREFILL_SHARE = 0.125
PREFILL_PROBE = 64  # the verify size whose cost per token stands for a prefill token's
MIN_WINDOW = 64


def prob_prior() -> torch.Tensor:
    """Prior: the drafter's probability is right, shrunk a little (bin centres x 0.8), at every depth."""
    edges = [0.0] + PROB_EDGES.tolist() + [1.0]
    centres = torch.tensor([(a + b) / 2 for a, b in zip(edges, edges[1:])]) * 0.8
    return centres.repeat(DEPTHS)


def prob_cells(raw_logp: torch.Tensor, depth: int) -> torch.Tensor:
    bins = torch.bucketize(raw_logp.float().exp().cpu(), PROB_EDGES)
    return (min(depth, DEPTHS) - 1) * (PROB_EDGES.numel() + 1) + bins


class ExpandingSource:
    """Shared expansion logic; subclasses provide the stepper (``_stepper``) and the cost per level."""

    name = "model"

    def __init__(self, top_k: int = 8, depth: int = 8, max_total: int = 64, cost_curve=None,
                 prune_against: str = "best", explore: float = EXPLORE):
        self.modelled_cost = 0.25  # one level in target forwards, from sizes (subclasses set ``cost``)
        # how much longer than modelled a level takes here, measured by the drafter (>= 1; 1 until measured): a small
        # head's forward is bound by per-call overhead, not by the bytes it reads (stop 52: ~2.3x its modelled cost)
        self.clock = 1.0
        self.top_k, self.depth, self.max_total = int(top_k), int(depth), int(max_total)
        self.explore = float(explore)  # standard errors added to a level's rate when deciding to draft it
        self.prune_against = prune_against  # what a deeper level must beat (budget.best_tree's rule)
        self.calibration = Calibration(prob_prior(), levels=DEPTHS)
        self.cost_curve = cost_curve  # relative verify cost by tree size (target forwards), or None

    @property
    def cost(self) -> float:
        """One drafting level in target forwards: the modelled cost times what the clock said (``clock``)."""
        return self.modelled_cost * self.clock

    @cost.setter
    def cost(self, value: float) -> None:
        self.modelled_cost = float(value)

    def calibrated(self, raw: torch.Tensor, depth: int) -> torch.Tensor:
        """The conditional acceptance log-probs this source's calibration gives raw log-probs at ``depth``."""
        return self.calibration.logp(prob_cells(raw, depth))

    def _verify_cost(self, n: int) -> float:
        return 1.0 if self.cost_curve is None else self.cost_curve(n)

    def level_cost(self, width: int) -> float:
        """One drafting call over ``width`` nodes, in target forwards: ``cost`` scaled by the target's own
        cost of ``width`` tokens (same machine, same kind of network; on a CPU 8 tokens cost ~1.3 single ones)."""
        return self.cost * self._verify_cost(max(1, width))

    def _stepper(self, rc: RoundContext):
        raise NotImplementedError

    def propose(self, rc: RoundContext, index: int) -> Proposal | None:
        depth = min(self.depth, rc.max_depth)
        if depth <= 0:
            return None
        stepper = self._stepper(rc)
        if rc.sampling is not None:
            stepper = coupled(stepper, rc.sampling, rc.noise, rc.root_pos)
        cells: list[torch.Tensor] = []

        def calibrate(raw: torch.Tensor, d: int) -> torch.Tensor:
            c = prob_cells(raw, d)
            cells.append(c)
            return self.calibration.logp(c).to(raw.device)

        others = torch.cat([p.cands.score.float().cpu() for p in rc.earlier]) if rc.earlier else torch.zeros(0)
        deeper = self._pruner(others, cells)
        from drafttree.tree import expand_candidates

        prune = self.cost_curve is not None  # a fixed tree size (no cost curve) drafts every level
        cands = expand_candidates(stepper, depth, self.top_k, calibrate=calibrate, deeper=deeper if prune else None)
        return Proposal(index, cands, torch.cat(cells).to(torch.long), spent=deeper.spent[0] if prune else None)

    def _pruner(self, others: torch.Tensor, cells: list, offset: float = 0.0, depth_offset: int = 0):
        """``deeper`` for :func:`expand_candidates`: expanding the ``w`` best frontier nodes adds at most their
        mass x the next depth's acceptance rate, for ``level_cost(w)``; the level is drafted at the width that
        raises tokens per unit of (draft + verify) time the most, and not at all when no width raises it.
        A costly drafter thus drafts a chain where its top guess carries the mass, a tree where it does not.
        ``offset`` is the log-probability of the branch the expansion starts below (0: the root)."""
        spent = [self.cost]  # the root distribution costs about one call

        def deeper(scores: torch.Tensor, frontier: torch.Tensor) -> bool | int:
            scores = scores.cpu() + offset
            best = torch.sort(torch.cat([scores, others.cpu()]), descending=True).values.tolist()
            n, e_now, t_now = best_tree(best, spent[0], self._verify_cost, self.max_total - 1, rule=self.prune_against)
            rate_next = self.level_rate(len(cells) + 1 + depth_offset)
            front = scores[frontier.cpu()]
            gains = (front.exp().cumsum(0) * rate_next).tolist()
            width, ratio = 0, e_now / t_now
            v_now = self._verify_cost(n + 1)
            # the nodes expanding w frontier nodes adds to the verified tree (the old rule, "all": none counted)
            joins = joining(front.tolist(), best, n) if self.prune_against == "best" else [0] * len(gains)
            for w, (gain, j) in enumerate(zip(gains, joins), start=1):
                r = (e_now + gain) / (t_now + self.level_cost(w) + self._verify_cost(n + 1 + j) - v_now)
                if r > ratio:
                    width, ratio = w, r
            if width == 0:
                return False
            spent[0] += self.level_cost(width)
            return width

        deeper.spent = spent
        return deeper

    def level_rate(self, depth: int) -> float:
        """How often an accepted node of this source at ``depth - 1`` had a child accepted at ``depth``: what
        expanding a node is worth. Counted per tested parent, not per tested node (siblings verified beside the
        best child would otherwise dilute it), and a depth not yet drafted reads as the depth above it."""
        return self.calibration.level_rate(min(depth, DEPTHS) - 1, explore=self.explore)

    @staticmethod
    def cell_levels(cells: list[int]) -> list[int]:
        """The depth level (0-based) of each calibration cell (:func:`prob_cells`; the hybrid passes only this
        source's own cells: another source's node repeated here carries none)."""
        nb = PROB_EDGES.numel() + 1
        return [c // nb for c in cells]


class HeadSource(ExpandingSource):
    """An EAGLE head drafting from the target's features."""

    name = "head"

    def __init__(self, head, **kw):
        super().__init__(**kw)
        from drafttree.drafters.eagle import EagleState

        self.head = head
        self._state_cls = EagleState
        self.state = EagleState(head)
        self.cost = head.level_cost()  # one level reads the head's layers and its LM-head rows
        self.backlog: list[tuple[torch.Tensor, list[int]]] = []
        self.last_pairs = 1
        self.prepared = None  # this round's chain from a batch pass (batching/head_pass.py), if one ran

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        self.state = self._state_cls(self.head)
        ids = prompt.reshape(-1).tolist()
        self.backlog = [(prefill_features, ids[1:] + [root])]
        self.prepared = None
        self.last_pairs = 1  # pairs the last round committed (what a head drafting every round encodes a round)

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        self.backlog.append((features, committed[1:] + [next_root]))
        self.last_pairs = len(committed)
        self.prepared = None

    def ready_state(self):
        """The head's state with every committed pair queued (a batch pass drafts from it)."""
        self._sync()
        return self.state

    def propose(self, rc: RoundContext, index: int) -> Proposal | None:
        """From the batch pass's chain when it drafted this round (``prepared``: paid by the batch), else alone."""
        prep, self.prepared = self.prepared, None
        if prep is None:
            # the first call also encodes every pair committed since the head last drafted (one forward over them
            # all): after a closed gate's long wait more than a level's cost, which sizes this round's tree; what
            # exceeds the last round's pairs is catch-up, which the gates do not hold against drafting
            last = self.last_pairs  # a round's own pairs (the prompt's, before the first round, are catch-up)
            pending = sum(len(ts) for _, ts in self.backlog) + self.state.queued_pairs
            t0 = time.perf_counter()
            self._sync()
            self.state.flush()
            weights = self.head.fc.weight
            if weights.device.type == "cuda":
                torch.cuda.synchronize(weights.device)
            flush_seconds = time.perf_counter() - t0
            prop = super().propose(rc, index)
            if prop is not None and prop.spent is not None and pending > 1:
                prop.spent += self.level_cost(pending) - self.cost
                if pending > last:
                    prop.catch_up = self.level_cost(pending) - self.level_cost(last)
                    prop.catch_up_seconds = flush_seconds * prop.catch_up / self.level_cost(pending)
            return prop
        depth = min(self.depth, rc.max_depth)
        if depth <= 0:
            return None
        cells: list[torch.Tensor] = []

        def calibrate(raw: torch.Tensor, d: int) -> torch.Tensor:
            c = prob_cells(raw, d)
            cells.append(c)
            return self.calibration.logp(c)

        cands = prep.candidates(self.state.vocab_ids, self.top_k, depth, calibrate)
        return Proposal(index, cands, torch.cat(cells).to(torch.long), spent=0.0)

    def _sync(self) -> None:
        if self.backlog:
            feats = torch.cat([f for f, _ in self.backlog])
            ids = [t for _, ts in self.backlog for t in ts]
            self.state.encode(feats, ids, self.state.root_pos)
            self.backlog = []

    def _stepper(self, rc: RoundContext):
        self._sync()
        return self.state


class AssistantSource(ExpandingSource):
    """A Gemma 4 assistant (heads/assistant.py) drafting from the target's hidden state and keys and values."""

    name = "head"

    def __init__(self, head, **kw):
        super().__init__(**kw)
        from drafttree.drafters.assistant import AssistantState

        self.head = head
        self.state = AssistantState(head)
        self.cost = head.level_cost()  # one level reads the assistant's weights

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        self.state.encode(prefill_features, prompt.reshape(-1).tolist()[1:] + [root], 0)

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        self.state.encode(features, committed[1:] + [next_root], self.state.root_pos)

    def _stepper(self, rc: RoundContext):
        self.state.attach(rc.target)
        return self.state


class DFlashSource(ExpandingSource):
    """A DFlash drafter (heads/dflash.py): one forward drafts every depth of its block, so the first level costs a
    drafter call and the deeper ones only their nodes' verification."""

    name = "head"

    def __init__(self, head, **kw):
        super().__init__(**kw)
        from drafttree.drafters.dflash import DFlashState

        self.head = head
        self.state = DFlashState(head)
        self.depth = min(self.depth, self.state.max_depth)
        self.cost = head.level_cost()  # the round's one forward

    def level_cost(self, width: int) -> float:
        return 0.0  # read from the round's forward

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        from drafttree.drafters.dflash import DFlashState

        self.state = DFlashState(self.head)
        self.state.encode(prefill_features, prompt.reshape(-1).tolist()[1:] + [root], 0)

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        self.state.encode(features, committed[1:] + [next_root], self.state.root_pos)

    def _stepper(self, rc: RoundContext):
        return self.state


class DraftLMSource(ExpandingSource):
    """A small LM sharing the target's tokenizer, drafting a top-k tree with tree attention."""

    name = "draft"

    def __init__(self, draft_model: torch.nn.Module, vocab_size: int, target_params: int, extend: bool = False,
                 window: int | str = "auto", **kw):
        super().__init__(**kw)
        from drafttree.drafters.draft_model import DraftLMState, param_count

        self.window = window  # tokens, or "auto": prefill_window's rule
        self.lm = DraftLMState(draft_model, vocab_size)
        self.cost = param_count(draft_model) / max(1, target_params)
        self.extend = extend
        self.extended = 0  # rounds that drafted on after another source's branch (diagnostics, tests)

    def propose(self, rc: RoundContext, index: int) -> Proposal | None:
        base = super().propose(rc, index)
        if not self.extend or base is None:
            return base
        chain = likeliest_branch(rc.earlier, EXTEND_MIN)
        depth = min(self.depth, rc.max_depth) - len(chain)
        if not chain or depth <= 0:
            return base
        return self._extend(base, chain, depth, rc)

    def _extend(self, base: Proposal, chain: list[tuple[int, float, float]], depth: int,
                rc: RoundContext) -> Proposal:
        """Draft ``depth`` more levels after ``chain`` (token, cond_logp, score per node, from the root): one
        draft forward reads the chain, then an EAGLE-2 expansion continues from its end. The chain's nodes come
        back with cell -1 (another source's guess: they teach this source's calibration nothing)."""
        from drafttree.tree import expand_candidates

        lm = self.lm.lm
        n = len(chain)
        self.extended += 1
        lm.discard_pending()
        toks = torch.tensor([t for t, _, _ in chain], dtype=torch.long)
        out = lm.forward_nodes(self.lm._ids(toks.tolist()), torch.arange(lm.length, lm.length + n),
                               torch.tril(torch.ones(n, n, dtype=torch.bool)))
        root_lp = torch.log_softmax(out.logits[-1, : self.lm.vocab].float(), dim=-1)
        stepper = _PrefixedStepper(lm, root_lp, self.lm.vocab, n)
        if rc.sampling is not None:  # its root is the chain's last node, n deeper than the round's root
            stepper = coupled(stepper, rc.sampling, rc.noise, rc.root_pos + n)
        cells: list[torch.Tensor] = []

        def calibrate(raw: torch.Tensor, d: int) -> torch.Tensor:
            c = prob_cells(raw, d + n)
            cells.append(c)
            return self.calibration.logp(c).to(raw.device)

        others = torch.cat([base.cands.score.float().cpu(), torch.tensor([s for _, _, s in chain])])
        deeper = self._pruner(others, cells, chain[-1][2], n) if self.cost_curve is not None else None
        cont = expand_candidates(stepper, depth, self.top_k, calibrate=calibrate, deeper=deeper)
        b, m = base.cands, int(base.cands.tokens.numel())
        dev = b.tokens.device
        chain_par = torch.arange(m - 1, m + n - 1, dtype=torch.long)
        chain_par[0] = -1
        cont_par = torch.where(cont.parents < 0, torch.full_like(cont.parents, m + n - 1), cont.parents + m + n)
        cond = torch.tensor([c for _, c, _ in chain], dtype=torch.float32)
        score = torch.tensor([s for _, _, s in chain], dtype=torch.float32)
        cands = Candidates(
            torch.cat([b.tokens, toks.to(dev), cont.tokens]), torch.cat([b.parents, chain_par.to(dev), cont_par]),
            torch.cat([b.cond_logp.float(), cond.to(dev), cont.cond_logp.float()]),
            torch.cat([b.score.float(), score.to(dev), cont.score.float() + float(score[-1])]),
            torch.cat([b.raw_logp.float(), torch.zeros(n, device=dev), cont.raw_logp.float()]),
            b.levels + 1 + cont.levels)
        cells_all = torch.cat([base.cells, torch.full((n,), -1, dtype=torch.long), torch.cat(cells).to(torch.long)])
        below = deeper.spent[0] - self.cost if deeper is not None else cont.levels * self.cost
        spent = (base.spent if base.spent is not None else (1 + b.levels) * self.cost) + self.level_cost(n) + below
        return Proposal(base.source, cands, cells_all, spent=spent)

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        self.lm.reset()

    def keep_prefix(self, on: bool) -> None:
        self.lm.keep(on)

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        pass

    def prefill_window(self, remaining: int) -> int:
        """How many of the context's last tokens a fresh prefill of the draft reads (0: all): ``window`` as given, or
        with "auto" as many as it can read in an eighth (PREFILL_SHARE) of the time plain decoding would take for the
        ``remaining`` tokens of the answer. A prefill token is costed as one token of a 64-token verify forward, the
        curve's compute-bound end, times the draft's own cost: on this CPU at L (1.5B target, 0.5B draft) ~20 draft
        tokens a target step, so a 128-token answer lets it read 320 (logs/s82_window_of.log); on a GPU, where prefill
        is cheap next to a decoding step, thousands. Without a cost curve: all of it."""
        if not isinstance(self.window, str):
            return int(self.window)
        if self.cost_curve is None:
            return 0
        per_token = self.cost * self._verify_cost(PREFILL_PROBE) / PREFILL_PROBE
        return max(MIN_WINDOW, int(PREFILL_SHARE * max(1, remaining) / max(per_token, 1e-9)))

    def _stepper(self, rc: RoundContext):
        return self.lm.stepper(rc.context, self.prefill_window(rc.max_depth + 1))


def likeliest_branch(earlier: list[Proposal], min_p: float) -> list[tuple[int, float, float]]:
    """The deepest node of the earlier proposals whose estimated probability of acceptance is >= ``min_p``
    (ties: the likeliest), as (token, cond_logp, score) per node from the root; [] when none is."""
    best, best_key = None, None
    for prop in earlier:
        c = prop.cands
        par = c.parents.tolist()
        depth = [0] * len(par)
        for i, q in enumerate(par):  # parents come before children
            depth[i] = 1 if q < 0 else depth[q] + 1
        for i, s in enumerate(c.score.tolist()):
            if s >= math.log(min_p) and (best_key is None or (depth[i], s) > best_key):
                best, best_key = (prop, i), (depth[i], s)
    if best is None:
        return []
    prop, i = best
    c, out = prop.cands, []
    while i >= 0:
        out.append((int(c.tokens[i]), float(c.cond_logp[i]), float(c.score[i])))
        i = int(c.parents[i])
    return out[::-1]


class _PrefixedStepper:
    """Expands below ``prefix`` pending draft slots (a chain every new node sees), one position deeper each."""

    vocab_ids = None

    def __init__(self, lm, root_lp: torch.Tensor, vocab: int, prefix: int):
        self.lm, self._root_lp, self.vocab, self.prefix = lm, root_lp, vocab, prefix

    def root_logprobs(self) -> torch.Tensor:
        return self._root_lp

    def expand(self, tokens, parent_slots, attend, depth):
        m = tokens.shape[0]
        positions = torch.full((m,), self.lm.length - 1 + self.prefix + depth, dtype=torch.long)
        seen = torch.cat([torch.ones(m, self.prefix, dtype=torch.bool, device=attend.device), attend], dim=1)
        out = self.lm.forward_nodes(tokens, positions, seen)
        return torch.log_softmax(out.logits[:, : self.vocab].float(), dim=-1)
