"""One tree fed by every drafter: candidate sources merged as a trie, ranked by calibrated acceptance.

Each round the sources propose in order, cheapest first (context n-grams, then the EAGLE head and/or a draft LM).
Their candidates are merged into one trie (a node proposed by several sources is rated by what such agreement was
worth, drafters/merged.py), every node is ranked by its estimated probability of being accepted (product of
calibrated conditional rates along its path), and the best N are verified, N chosen on this machine's verify-cost
curve to maximise expected tokens per unit of time; N = 1 (the root alone, plain decoding) when no tree is expected
to pay for its verification. After verification every verified node whose parent was accepted updates its source's
calibration cell (or its agreement cell), and a :class:`Gate` stops running a costly source while its own accepted
tokens (those no other source proposed) do not pay for its drafting; when sampling, one more gate stops drafting at
all (plain decoding rounds, with probes) while a round's accepted drafts do not pay for its drafting and the tree's
extra verification, both in target steps (free text, where n-gram guesses are seldom drawn). Tree sizes come from
the cached cost curve (corrected by the verify forwards' own times with ``live_curve``, live_curve.py) and counters;
the drafting gate also reads the clock, which may only say drafting costs more than modelled. The output never
depends on any of it (noise.py). In batched rounds even the free sources' drafting time delays every row, and a
:class:`Gate` on the row's measured drafting time stops rows whose drafts do not pay for it.
"""

from __future__ import annotations

import math
import time

import torch

from drafttree.budget import least_slope
from drafttree.drafters.base import Drafter, DraftRequest
from drafttree.drafters.merged import Agreement, MergedTree
from drafttree.sources.base import CandidateSource, Proposal, RoundContext
from drafttree.tree import DraftTree

# What a drafting round costs outside the sources' own counted work (the free sources' lookups, merging, sizing and
# learning): seconds, modelled, not timed, so gates do not sway with the machine's load. ~1 ms measured on a 2-core
# CPU (a T=1 profile of the default: ~1.1 ms a round for n-grams + corpus + merge + learning).
ROUND_SECONDS = 1.0e-3
CLOCK_DECAY = 0.9  # per costly-source round, for the measured ratio of its drafting time to its modelled cost


class Gate:
    """Runs a costly source only while its marginal accepted tokens pay for it, probing now and then.

    State per *situation* (what the cheaper sources proposed this round: nothing / a weak / a strong
    branch): averages of the source's marginal accepted tokens, of its cost and of the tokens a round gives
    without it (the root plus the others' accepted drafts). The source pays when gain > cost x those tokens:
    its drafting time could have run that many target forwards. A new situation starts at ``optimism``
    times what would just pay, so it takes repeated failures to close. A closed gate re-opens for one probe
    round after ``probe`` rounds, the wait doubling after each failed probe (up to ``max_probe``).
    """

    def __init__(self, probe: int = 8, max_probe: int = 64, decay: float = 0.7, enabled: bool = True,
                 optimism: float = 2.0):
        self.probe0, self.max_probe, self.decay, self.enabled = probe, max_probe, decay, enabled
        self.optimism = optimism  # a situation's first gain estimate, in multiples of what would just pay
        self.reset()

    def reset(self) -> None:
        self.gain: dict[int, float] = {}
        self.cost: dict[int, float] = {}
        self.base: dict[int, float] = {}  # tokens per round without this source, per situation
        self.wait: dict[int, int] = {}
        self.since: dict[int, int] = {}

    def rewind(self) -> None:
        """A new generation: keep what the gate learned (a fresh start re-learns, at a cost, that a weak source does
        not pay) but forget the waits, so that a closed situation is probed again soon."""
        self.wait, self.since = {}, {}

    def pays(self, situation: int) -> bool:
        return self.gain[situation] > self.cost[situation] * self.base[situation]

    def allow(self, situation: int) -> bool:
        if not self.enabled or situation not in self.gain or self.pays(situation):
            return True
        self.since[situation] = self.since.get(situation, 0) + 1
        if self.since[situation] >= self.wait.get(situation, self.probe0):
            self.since[situation] = 0
            return True
        return False

    def record(self, situation: int, gain: float, cost: float, base_tokens: float) -> None:
        d, s = self.decay, situation
        paid_before = s not in self.gain or self.pays(s)
        if s not in self.gain:  # presumed useful: one unlucky first round must not close the gate
            self.gain[s], self.cost[s], self.base[s] = self.optimism * cost * base_tokens, cost, base_tokens
        self.gain[s] = d * self.gain[s] + (1 - d) * gain
        self.cost[s] = d * self.cost[s] + (1 - d) * cost
        self.base[s] = d * self.base[s] + (1 - d) * base_tokens
        if self.pays(s):
            self.wait[s] = self.probe0
        elif not paid_before:  # a failed probe: wait longer next time
            self.wait[s] = min(self.max_probe, 2 * self.wait.get(s, self.probe0))


def situation(earlier: list[Proposal]) -> int:
    """0: no cheaper source proposed anything; 1: they expect < 1 accepted token; 2: more."""
    e = sum(p.expected for p in earlier)
    return 0 if not earlier else (1 if e < 1.0 else 2)


class HybridDrafter(Drafter):
    """Sources -> one ranked tree. ``sources`` are tried in order (cheapest first); ``budget`` a TreeBudget
    (its cost curve sizes the tree); ``total_tokens`` fixes the tree size instead (tests, sweeps)."""

    def __init__(self, sources: list[CandidateSource], budget=None, total_tokens: int | None = None,
                 gate: bool = True, name: str = "hybrid", costly_in_batches: bool = False,
                 batch_pass: bool = False, agree: bool = True, clock_cost: bool = False, live=None,
                 batch_pack: bool = True, noise_cells: bool = False):
        if budget is None and total_tokens is None:
            raise ValueError("HybridDrafter needs a TreeBudget or a fixed total_tokens")
        self.sources = list(sources)
        self.budget, self.total_tokens = budget, total_tokens
        self.base_cost = budget.cost if budget is not None else None  # batched rounds charge a share of it
        # ``live``: a LiveCurve (live_curve.py) that lone rounds' verify times correct; base_cost follows it
        self.live = live if budget is not None else None
        if self.live is not None:
            self.base_cost = self.live.curve
        # gates learn per sampling mode too (what pays at T=0 need not at T=1); _start_generation picks the set
        self._gate_sets = {mode: ([Gate(enabled=gate and s.cost > 0) for s in self.sources], Gate(enabled=gate))
                           for mode in ("greedy", "sampled")}
        self.gates, self.batch_gate = self._gate_sets["greedy"]
        # acceptance differs between argmax (T=0) and sampling (a candidate is accepted with the target's
        # probability of it), so each mode has its own calibration per source, with its own fitted prior; with
        # ``noise_cells`` the free sources' sampled cells are split by their candidates' noise (sources/base.py)
        self.calibrations = {"greedy": [s.calibration for s in self.sources],
                             "sampled": [s.sampled_calibration() if noise_cells and hasattr(s, "sampled_calibration")
                                         else s.calibration.fresh() for s in self.sources]}
        # nodes several sources proposed are rated by what such agreement was worth (drafters/merged.py), and each
        # source's own cells learn from the nodes it alone proposed; ``agree=False``: the best single estimate, and
        # every source learns from every node it proposed (the rule until stop 51)
        self.agree = agree
        # costly sources' level costs corrected by the clock where drafting takes longer than modelled (``_clock``);
        # kept across generations, like the calibrations. Off by default (no gain measured: drafters/options.py)
        self.clock_cost = clock_cost
        self._clocks: dict[int, float] = {}
        self.agreements = {mode: Agreement(len(self.sources)) for mode in ("greedy", "sampled")}
        self.agreement = self.agreements["greedy"]
        self.name = name
        # a costly source drafts one row at a time: in a batch of B rows, B such calls weigh against one shared
        # forward and cannot pay (docs/benchmark-notes.md: a steady load of 4 users gained on plain decoding with
        # the n-gram source alone and lost with the head); batched rounds use the free sources unless this is set
        self.costly_in_batches = costly_in_batches
        self.batch_pass = batch_pass  # ... or a batch pass drafts every row's head at once (batching/head_pass.py)
        # in a batch that packs (BatchShare.packed), offer every node above the batch's bar and let the batch keep the
        # best nodes over all rows (BatchDecoder): one row's tree alone cannot fill a block of AMX tile rows
        self.batch_pack = batch_pack
        self._ranked: list[float] | None = None  # this round's nodes' estimates, best first (ranked / shrink)
        # (``batch_gate``) in a batch, drafting at all must pay for its time (Python, ~0.35 ms a row: 15% of a 16-row
        # round): the row's accepted drafts against the tokens the whole batch could have made in that time
        # alone and sampling, drafting at all must pay too: a round's accepted drafts against its drafting and the
        # tree's extra verification, in target steps, per situation (the last round accepted drafts or not); a closed
        # gate makes plain decoding rounds and probes every 4-16 of them
        self.draft_gate = Gate(probe=4, max_probe=16, decay=0.85, enabled=gate)
        # the same at T=0 (``greedy_gate``; off unless asked for), where a closed gate still lets strong n-grams draft
        self.greedy_draft_gate = Gate(probe=4, max_probe=16, decay=0.85, enabled=False)
        self.round_seconds = ROUND_SECONDS
        self._draft: tuple[Gate, int, float] | None = None  # (gate, situation, cost in steps) of this round's drafting
        self._spent = 0.0
        self._catch_up = (0.0, 0.0)  # this round's catch-up (target steps, seconds), see Proposal.catch_up
        self._last_accepted = 0
        self._gated = False  # the last round's draft gate was closed (situation 2 when it accepted nothing)
        self._batch: tuple | None = None  # (batch size bucket, drafting seconds, the row's BatchShare, tokens)
        self.last_alone: dict[int, int] = {}  # per source (id): accepted tokens last round no other source proposed
        self._round: tuple | None = None
        self._fresh = True
        self.source_accepts = [0] * len(self.sources)  # accepted drafts each source proposed (diagnostics)

    # the batch gate charges a row's drafting with its tree's verification too (BatchShare.verify: the round's forward
    # over the row's nodes), as the lone draft gate does: the budget keeps only nodes that pay at the margin, but
    # drafting at all must pay for its Python and its nodes together (False: the Python alone, the rule until stop 65)
    batch_gate_verify = True

    def keep_prefix(self, on: bool) -> None:
        for s in self.sources:
            if hasattr(s, "keep_prefix"):  # the sources with a model of their own (a draft LM)
                s.keep_prefix(on)

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        for s in self.sources:
            s.begin(prompt, prefill_features, root)
        for gates, batch_gate in self._gate_sets.values():
            for g in [*gates, batch_gate]:
                g.rewind()
        self.draft_gate.rewind()
        self.greedy_draft_gate.rewind()
        self._batch = None
        self._draft = None
        self._last_accepted = 0
        self._gated = False  # the last round's draft gate was closed (situation 2 when it accepted nothing)
        self._round = None
        self._fresh = True
        self.source_accepts = [0] * len(self.sources)

    def _start_generation(self, greedy: bool = True) -> None:
        """Pick the calibrations and gates of this sampling mode, keeping what earlier generations learned (the
        calibrations half-weighted, so that a new kind of prompt takes over quickly; seeded or not: drafting never
        changes the output)."""
        mode = "greedy" if greedy else "sampled"
        self.gates, self.batch_gate = self._gate_sets[mode]
        for s, cal in zip(self.sources, self.calibrations[mode]):
            s.calibration = cal
            cal.decay(0.5)
        self.agreement = self.agreements[mode]
        self.agreement.decay(0.5)
        self._fresh = False

    def _packs(self, cost) -> bool:
        return self.batch_pack and self.total_tokens is None and bool(getattr(cost, "packed", False))

    def _size(self, merged: MergedTree, spent: float, cost=None, context: int = 0, bar: float = 0.0) -> int:
        if self.total_tokens is not None:
            return min(int(self.total_tokens), len(merged.tokens))
        scores = sorted(merged.scores[1:], reverse=True)
        if self._packs(cost):  # every node that could pay in some tree of the batch's; the batch picks among them
            c = self.budget.calibration
            return 1 + sum(1 for x in scores[: self.budget.max_total - 1] if c * math.exp(x) >= bar)
        self.budget.cost = cost if cost is not None else self.base_cost.at(context)
        return self.budget.choose_total(scores, spent * self.base_cost.verify(1))

    def _bar(self, cost) -> float:
        """In a batch, the acceptance below which no tree can pay this round: a tree of n nodes, none estimated
        above p, adds at most n * p tokens for the forward's cost of n more tokens; the lowest p at which some n
        could pay (the budget's own rule, with no drafting time: the free sources draft in batches). 0 alone."""
        b = self.budget
        if cost is None or b is None or self.total_tokens is not None or b.calibration <= 0:
            return 0.0
        tokens = 1.0 + getattr(cost, "extra_tokens", 0.0)
        return tokens * least_slope(cost, b.max_total - 1) / (b.calibration * (b.overhead + cost.verify(1)))

    def batch_head(self, cost, greedy: bool = True) -> tuple[object, float] | None:
        """In a batched round (``cost``: the row's BatchShare), the head source a batch pass may draft for, and the
        least acceptance that pays this round; None when this drafter has none or drafts it row by row."""
        if self.costly_in_batches or not self.batch_pass or not greedy:  # the pass drafts without the noise (T=0 only)
            return None
        for src in self.sources:
            if hasattr(src, "ready_state"):
                if self._fresh:
                    self._start_generation(greedy)
                return src, self._bar(cost)
        return None

    def propose(self, req: DraftRequest) -> DraftTree:
        self._ranked = None
        if self._fresh:
            self._start_generation(req.sampling.greedy)
        if req.max_depth <= 0:
            return DraftTree.root_only(req.root)
        t0 = time.perf_counter()
        batched = req.cost is not None and self.total_tokens is None
        # one gate state per batch size (1, 2-3, 4-7, ...): what pays in a batch of 16 may well pay in one of 2
        size = int(getattr(req.cost, "rows", 2)).bit_length() if batched else 0
        if batched and not self.batch_gate.allow(size):
            return DraftTree.root_only(req.root)
        # at T=0 only with ``greedy_gate``: there the budget's calibrated trees paid on every task measured (stop 33),
        # and a closed gate missed the start of copy runs (tau 2.17 -> 2.11 on 11 prompt classes); a closed greedy
        # gate therefore still lets the context n-grams draft where their best first token pays (``_cheap_bar``)
        gate = self.greedy_draft_gate if req.sampling.greedy else self.draft_gate
        alone = not batched and self.total_tokens is None and self.base_cost is not None and gate.enabled
        # situations: 1 the last round accepted drafts; 0 it drafted and accepted none; 2 it was gated and accepted
        # none. Without 2 a gate closed after a miss would stay closed until a probe (a plain round accepts nothing, so
        # the next round is a miss again): at L that cost tau 3.54 -> 3.03 (stop 52)
        sit = 1 if self._last_accepted > 0 else (2 if self._gated else 0)
        self._gated = False
        if alone and not gate.allow(sit):
            self._gated = True
            bar = self._cheap_bar(req) if req.sampling.greedy else None
            tree = self._propose(req, cheap=bar) if bar is not None else None
            if tree is not None and tree.size > 1:
                req.info["gated"] = True
                return tree
            req.info.update(tree_tokens=1, depth=0, sources=[], gated=True)
            return DraftTree.root_only(req.root)
        tree = self._propose(req)
        if alone:  # the round's drafting in target steps (counted work and modelled Python, or the clock where it
            # says more: a loaded machine), plus the tree's extra verification
            cost = self.base_cost.at(len(req.context))
            v1 = cost.verify(1)
            steps, seconds = self._catch_up
            drafting = max((self._spent - steps) * v1 + self.round_seconds, time.perf_counter() - t0 - seconds)
            self._draft = (gate, sit, (drafting + cost.verify(tree.size) - v1) / v1)
        if batched:
            self._batch = (size, time.perf_counter() - t0, req.cost, 1.0 + float(req.cost.extra_tokens))
        return tree

    def _cheap_bar(self, req: DraftRequest) -> float | None:
        """While the greedy draft gate is closed: the least estimate at which the first (free) source's best first
        token pays for being verified and for a round's modelled drafting, in one-token forwards; None when the first
        source is not free."""
        if not self.sources or self.sources[0].cost > 0:
            return None
        cost = self.base_cost.at(len(req.context))
        v1 = cost.verify(1)
        return (cost.verify(2) - v1 + self.round_seconds) / v1

    def _propose(self, req: DraftRequest, cheap: float | None = None) -> DraftTree:
        """The round's tree from every source that may run; ``cheap``: the first (free) source alone, proposing only
        where its best first token is estimated at least that likely (a closed greedy draft gate)."""
        bar = self._bar(req.cost) if cheap is None else cheap
        rc = RoundContext(req.context, req.root, req.max_depth, req.sampling, [], bar, req.noise, req.target)
        limit = self.total_tokens if self.total_tokens is not None else self.budget.max_total
        merged = MergedTree(req.root)
        ran: list[tuple[int, int, float, float]] = []  # (source, situation, cost, extra) of costly sources that ran
        spent, catch_up, catch_up_seconds = 0.0, 0.0, 0.0
        # in a batch drafting delays the whole round: its cost is counted in rounds, against every row's tokens
        scale, extra = 1.0, float(getattr(req.cost, "extra_tokens", 0.0))
        if req.cost is not None and self.base_cost is not None:
            scale = self.base_cost.verify(1) / max(1e-12, req.cost.verify(1))
        for i, (src, gate) in enumerate(zip(self.sources, self.gates)):
            if cheap is not None and i > 0:
                break
            # drafted by a batch pass for every row at once (batching/head_pass.py): paid and gated by the batch
            prepared = getattr(src, "prepared", None) is not None
            if src.cost > 0 and req.cost is not None and not self.costly_in_batches and not prepared:
                continue
            sit = situation(rc.earlier)
            if src.cost > 0 and not prepared and not gate.allow(sit):
                continue
            t_src = time.perf_counter()
            prop = src.propose(rc, i)
            if src.cost > 0 and not prepared:
                if prop is not None and prop.spent is not None:
                    cost = prop.spent
                    self._clock(src, time.perf_counter() - t_src, cost, req.cost, len(req.context))
                else:
                    cost = (1 + (prop.cands.levels if prop is not None else 0)) * src.cost
                spent += cost
                steps = prop.catch_up if prop is not None else 0.0
                catch_up += steps
                catch_up_seconds += prop.catch_up_seconds if prop is not None else 0.0
                ran.append((i, sit, (cost - steps) * scale, extra))  # the gates weigh a round without catch-up
            if prop is None:
                continue
            rc.earlier.append(prop)
            merged.add(prop, limit)
        self._spent = spent  # the costly sources' drafting, in target steps (for the draft gate)
        self._catch_up = (catch_up, catch_up_seconds)
        if len(merged.tokens) == 1:  # nothing proposed: plain decoding this round, nothing to learn from it
            self._round = (merged, [0], ran) if ran else None
            req.info.update(tree_tokens=1, depth=0, sources=[])
            return DraftTree.root_only(req.root)
        if self.agree:
            merged.rescore(self.agreement)
        keep = merged.best(self._size(merged, spent, req.cost, len(req.context), bar))
        if req.chain:  # the round verifies, and learns from, its best chain only
            keep = merged.best_chain(keep)
        tree = self._tree_of(merged, keep, ran)
        if self._packs(req.cost) and tree.size > 1:
            c = self.budget.calibration
            self._ranked = [min(1.0, c * math.exp(x)) for x in sorted((merged.scores[i] for i in keep[1:]),
                                                                       reverse=True)]
        owners = sorted({self.sources[src].name for i in keep[1:] for src, _ in merged.owners[i]})
        req.info.update(tree_tokens=tree.size, depth=tree.max_depth, sources=owners)
        return tree

    def _tree_of(self, merged: MergedTree, keep: list[int], ran: list) -> DraftTree:
        """The tree of the merged nodes ``keep`` (the root first, parents before children): the round learns from it."""
        tokens = torch.tensor([merged.tokens[i] for i in keep], dtype=torch.long)
        pos = {node: j for j, node in enumerate(keep)}
        parents = torch.tensor([-1] + [pos[merged.parents[i]] for i in keep[1:]], dtype=torch.long)
        tree = DraftTree.from_parents(tokens, parents)
        tree.expected_accept = sum(math.exp(merged.scores[i]) for i in keep[1:])
        self._round = (merged, keep, ran)
        return tree

    def ranked(self) -> list[float] | None:
        return self._ranked

    def shrink(self, nodes: int) -> DraftTree:
        """The best ``nodes`` of this round's tree (merged.best's order: by score, a parent before its children, as
        :meth:`ranked` lists them); the round learns from those only."""
        if self._ranked is None or self._round is None:
            raise RuntimeError("shrink() needs a ranked tree from this round's propose()")
        merged, keep, ran = self._round
        nodes = max(0, min(int(nodes), len(keep) - 1))
        self._ranked = self._ranked[:nodes]
        if nodes == 0:
            self._round = (merged, [0], ran) if ran else None  # nothing verified but the root: nothing to learn
            return DraftTree.root_only(merged.tokens[0])
        return self._tree_of(merged, merged.best(nodes + 1), ran)

    def _clock(self, src, seconds: float, spent: float, batch_cost, context: int) -> None:
        """How much longer than modelled the costly source's drafting took (``src.clock``, >= 1): measured seconds over
        its modelled forwards x this machine's one-token forward (the cached curve), a decayed mean of per-round ratios
        (each capped at 8: one stall must not close a gate for long). Only alone (a batch's forward is not one
        token's), only where the source sizes by the curve (``spent``), and only with ``clock_cost``."""
        if not self.clock_cost or batch_cost is not None or self.base_cost is None or not hasattr(src, "clock"):
            return
        modelled = spent / max(1e-9, src.clock)
        if modelled <= 0:
            return
        ratio = min(8.0, seconds / (modelled * self.base_cost.at(context).verify(1)))
        mean = self._clocks.get(id(src))
        mean = ratio if mean is None else CLOCK_DECAY * mean + (1 - CLOCK_DECAY) * ratio
        self._clocks[id(src)] = mean
        src.clock = max(1.0, mean)

    def verified(self, tokens: int, context: int, seconds: float) -> None:
        if self.live is not None and self.live.observe(tokens, context, seconds):
            self.base_cost = self.live.curve

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        t0 = time.perf_counter()
        verified = len(self._round[1]) if self._round is not None else 1  # the tree's tokens (after any shrink)
        if self._round is not None:
            self._learn(committed)
            self._round = None
        for s in self.sources:
            s.observe(committed, features, next_root)
        if self._draft is not None:
            gate, sit, steps = self._draft
            gate.record(sit, float(len(committed) - 1), steps, 1.0)
            self._draft = None
        self._last_accepted = len(committed) - 1
        if self._batch is not None:
            size, spent, cost, tokens = self._batch
            forward = cost.verify(1)
            spent += time.perf_counter() - t0
            if self.batch_gate_verify:  # the tree's own verification: what the round took longer for its nodes
                spent += max(0.0, cost.verify(verified) - forward)
            self.batch_gate.record(size, float(len(committed) - 1), spent / max(1e-9, forward), tokens)
            self._batch = None

    def _learn(self, committed: list[int]) -> None:
        merged, keep, ran = self._round
        kept = set(keep)
        path = [0]
        for tok in committed[1:]:
            path.append(merged.child[(path[-1], tok)])
        on_path = set(path)
        updates: dict[int, tuple[list[int], list[bool], list[int], list[bool]]] = {}
        for node in keep[1:]:
            if merged.parents[node] in on_path:  # this node was put to the test
                hit = node in on_path
                agreed = merged.agreed[node]
                if agreed >= 0:
                    self.agreement.update(agreed, hit)
                for src, c in merged.owners[node]:
                    cells, outs, parents, own = updates.setdefault(src, ([], [], [], []))
                    cells.append(c)
                    outs.append(hit)
                    parents.append(merged.parents[node])
                    own.append(agreed < 0)
        for src, (cells, outs, parents, own) in updates.items():
            source = self.sources[src]
            # a source's cells: the nodes it alone proposed (agreed ones have their own table, when rescored)
            source.calibration.update([c for c, o in zip(cells, own) if o], [h for h, o in zip(outs, own) if o])
            levels = getattr(source, "cell_levels", None)
            if levels is not None:  # whether a level pays: every node of the source's, agreed or not
                source.calibration.update_levels(levels(cells), parents, outs)
        owners_on_path = [{s for s, _ in merged.owners[n]} for n in path[1:] if n in kept]
        for owners in owners_on_path:
            for s in owners:
                self.source_accepts[s] += 1
        accepted = len(path)
        self.last_alone = {id(src): sum(1 for owners in owners_on_path if owners == {i})
                           for i, src in enumerate(self.sources)}
        for i, sit, cost, extra in ran:
            alone = sum(1 for owners in owners_on_path if owners == {i})
            self.gates[i].record(sit, float(alone), cost, float(accepted - alone) + extra)


class SwitchDrafter(Drafter):
    """The published hybrids' rule, kept as a baseline: the first drafter's tree when it proposes anything,
    else the second's (e.g. prompt lookup when the context matches, EAGLE-2 otherwise)."""

    def __init__(self, first: Drafter, second: Drafter, name: str = "switch"):
        self.first, self.second, self.name = first, second, name

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        self.first.begin(prompt, prefill_features, root)
        self.second.begin(prompt, prefill_features, root)

    def keep_prefix(self, on: bool) -> None:
        self.first.keep_prefix(on)
        self.second.keep_prefix(on)

    def propose(self, req: DraftRequest) -> DraftTree:
        tree = self.first.propose(req)
        return tree if tree.size > 1 else self.second.propose(req)

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        self.first.observe(committed, features, next_root)
        self.second.observe(committed, features, next_root)
