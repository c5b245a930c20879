"""The hybrid drafter drafts only where drafting pays: a batch's bar, the draft gate over a sequence's situations, the
clock against the model of what drafting costs."""

from __future__ import annotations

import pytest
import torch

from drafttree.accept import Sampling
from drafttree.drafters.hybrid import Gate, HybridDrafter
from drafttree.sources.base import RoundContext
from tests.conftest import tiny_causal_lm
from tests.constant_source import ConstantSource

# ------------------------------------------------------------------------------------------ building blocks


@pytest.mark.parametrize("others,extra", [(15, 15.0), (3, 4.5), (40, 60.0), (30, 20.0)])
def test_a_batch_bar_skips_only_trees_that_cannot_pay(others, extra):
    """Below the bar no tree of nodes estimated at p or less is chosen by the budget, whatever its shape; just above
    it some tree is. And the n-gram source drafts nothing when its best first token is estimated below the bar."""
    import math

    from drafttree.budget import BatchShare, CostModel, TreeBudget
    from drafttree.sources.ngram import NgramSource

    curve = CostModel([1, 2, 4, 8, 16, 32, 64], [1.0, 1.02, 1.08, 1.15, 1.6, 2.6, 4.4])  # concave, then steep
    budget = TreeBudget(curve, max_total=16, min_total=1)
    hd = HybridDrafter([NgramSource()], budget=budget)
    share = BatchShare(curve, others, 16, others_tokens=extra)
    bar = hd._bar(share)
    assert bar > 0 and hd._bar(None) == 0.0
    budget.cost = share
    for n in range(1, 16):
        assert budget.choose_total([math.log(min(1.0, bar * 0.999))] * n, 0.0) == 1
    if bar * 1.01 <= 1:  # (a bar above 1: even certain nodes cannot pay for this batch's forward)
        assert max(budget.choose_total([math.log(bar * 1.01)] * n, 0.0) for n in range(1, 16)) > 1

    src = NgramSource()
    ctx = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]  # "5 6 7" followed by 8 twice: a strong first token
    first = src.calibration.rate_of(src.propose(RoundContext(ctx, 7, 4, Sampling(), []), 0).cells[0].item())
    assert src.propose(RoundContext(ctx, 7, 4, Sampling(), [], min_accept=first * 0.99), 0) is not None
    assert src.propose(RoundContext(ctx, 7, 4, Sampling(), [], min_accept=first * 1.01), 0) is None


def test_a_batched_row_stops_drafting_when_its_drafts_never_pay_and_a_row_alone_does_not():
    """In a batched round a row's drafting time delays every row: a row whose drafts are never accepted stops drafting
    (probing now and then), one whose drafts are accepted keeps drafting. Outside a batch (``cost`` None) nothing is
    gated on time, only on modelled costs."""
    from drafttree.budget import BatchShare, CostModel, TreeBudget
    from drafttree.drafters.base import DraftRequest

    curve = CostModel([1, 2, 4, 8, 16, 32, 64], [1.0, 1.02, 1.08, 1.15, 1.6, 2.6, 4.4])

    class Counting(ConstantSource):
        calls = 0

        def propose(self, rc, index):
            Counting.calls += 1
            return super().propose(rc, index)

    def drafts(share, accepted, rounds=40):
        Counting.calls = 0
        hd = HybridDrafter([Counting([3, 4, 5], prior=0.95)], budget=TreeBudget(curve, max_total=16, min_total=1))
        hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
        for _ in range(rounds):
            hd.propose(DraftRequest([1, 2, 2], 2, 8, Sampling(), None, cost=share))
            committed = [2, 3, 4, 5] if accepted else [2]
            hd.observe(committed, torch.zeros(len(committed), 4), 7)
        return Counting.calls

    batch = BatchShare(curve, 15, 16, others_tokens=15.0)
    # when it closes depends on the clock (a round's Python time against this curve's 1-second forwards: ~12-20 rounds
    # on a fast core), then it probes after 8, 16, 32, 64 rounds: far fewer calls than rounds, never none
    never = drafts(batch, accepted=False, rounds=120)
    assert 0 < never < 40, "a row whose drafts never pay must stop drafting, but probe"
    assert drafts(batch, accepted=True) == 40
    assert drafts(None, accepted=True) == 40


def test_a_sequence_alone_stops_drafting_where_drafts_do_not_pay_and_drafts_again_when_they_do():
    """Alone and sampling, a round's drafting (modelled seconds, or the clock's where it says more) and its tree's
    extra verification must be paid by its accepted drafts: drafts that are never accepted stop (with probes), drafts
    accepted again bring drafting back within a probe's wait, and the decisions are the same in every run (here the
    modelled 5% of a step outweighs the measured microseconds)."""
    from drafttree.budget import CostModel, TreeBudget
    from drafttree.drafters.base import DraftRequest

    curve = CostModel([1, 2, 4, 8], [1.0, 1.1, 1.3, 1.7])

    class Logging(ConstantSource):
        def propose(self, rc, index):
            self.asked.append(self.round)
            return super().propose(rc, index)

    sampled = Sampling(temperature=1.0)

    def run(plan, gate=True, sampling=sampled):
        src = Logging([3, 4, 5], prior=0.9)
        src.asked = []
        hd = HybridDrafter([src], budget=TreeBudget(curve, max_total=8, min_total=1), gate=gate)
        hd.round_seconds = 0.05  # drafting costs 5% of a step
        hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
        sizes = []
        for src.round, accepted in enumerate(plan):
            req = DraftRequest([1, 2, 2], 2, 8, sampling, None)
            sizes.append(hd.propose(req).size)
            committed = [2, 3, 4, 5] if accepted else [2]
            hd.observe(committed, torch.zeros(len(committed), 4), 7)
        return src.asked, sizes

    plan = [False] * 60 + [True] * 40
    asked, sizes = run(plan)
    missed = [r for r in asked if r < 60]
    assert 0 in missed and len(missed) < 30, "drafts never accepted must stop drafting"
    assert any(r >= 30 for r in missed), "... but probe now and then"
    assert len(run(plan, gate=False)[0]) == len(plan), "gate=False drafts every round"
    assert len(run(plan, sampling=Sampling())[0]) == len(plan), "greedy: the budget alone sizes the trees"
    resumed = min(r for r in asked if r >= 60)
    assert resumed - 60 <= 16, "a probe must find the source right again within the longest wait"
    assert asked[-(100 - resumed):] == list(range(resumed, 100)), "drafts that are accepted keep drafting"
    assert all(n > 1 for n in sizes[resumed + 1:])
    assert (asked, sizes) == run(plan), "modelled costs: the same rounds give the same decisions"


def test_a_gate_keeps_what_it_learned_across_generations_but_probes_again_soon():
    gate = Gate(probe=4, max_probe=16)
    for _ in range(6):
        gate.record(0, gain=0.0, cost=1.0, base_tokens=1.0)  # a source that never pays: closed, long waits
    assert not gate.pays(0) and gate.wait[0] > 4
    learned = (dict(gate.gain), dict(gate.cost), dict(gate.base))
    gate.rewind()
    assert (gate.gain, gate.cost, gate.base) == learned and not gate.pays(0)
    allowed = [gate.allow(0) for _ in range(8)]
    assert allowed.index(True) == 3, "a new generation probes after the first wait, not after the long one"


def test_the_draft_gate_counts_the_clock_where_drafting_took_longer_than_modelled():
    """A source whose drafting is modelled as free but takes 1.5 steps (a loaded machine, slow Python): the clock's
    cost closes the draft gate where the model alone would keep drafting."""
    import time as time_module

    from drafttree.budget import CostModel, TreeBudget
    from drafttree.drafters.base import DraftRequest

    curve = CostModel([1, 2, 4, 8], [0.01, 0.0101, 0.0102, 0.0104])  # 10 ms steps, trees nearly free

    class Slow(ConstantSource):
        delay = 0.0

        def propose(self, rc, index):
            time_module.sleep(self.delay)
            return super().propose(rc, index)

    def drafted(delay: float) -> int:
        src = Slow([3, 4, 5], prior=0.9)
        src.delay = delay
        hd = HybridDrafter([src], budget=TreeBudget(curve, max_total=8, min_total=1))
        hd.round_seconds = 0.0
        hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
        n = 0
        for _ in range(40):  # one draft accepted every round
            n += hd.propose(DraftRequest([1, 2, 2], 2, 8, Sampling(1.0), None)).size > 1
            hd.observe([2, 3], torch.zeros(2, 4), 7)
        return n

    assert drafted(0.0) == 40
    assert drafted(0.015) < 25, "drafting 1.5 steps for one token a round must stop (with probes)"


def test_the_draft_gate_is_an_option_of_the_composition():
    from drafttree.drafters import make_drafter
    from drafttree.models import LoadedModel

    tl = LoadedModel(tiny_causal_lm("llama", vocab=40, hidden=32, seed=3), None, "tiny", "")
    draft = LoadedModel(tiny_causal_lm("llama", vocab=40, hidden=32, seed=4), None, "tiny-draft", "")
    gates = [make_drafter("hybrid", tl, draft, None, total_tokens=4, **kw).draft_gate.enabled
             for kw in ({}, {"draft_gate": True}, {"draft_gate": True, "gate": False})]
    assert gates == [False, True, False]  # off unless asked for (options.py), and only with the costly sources' gate
    greedy = [make_drafter("hybrid", tl, draft, None, total_tokens=4, **kw).greedy_draft_gate.enabled
              for kw in ({}, {"greedy_gate": True}, {"greedy_gate": True, "gate": False})]
    assert greedy == [False, True, False]


def test_a_closed_greedy_gate_plain_decodes_but_lets_a_strong_first_source_draft():
    """At T=0 with the greedy draft gate on: drafting whose accepted half-token a round does not pay for a round's
    drafting (modelled at 1.5 forwards here) closes the gate, and rounds verify the root alone; while it is closed the
    first (free) source still drafts, alone, where its best first token is estimated likely enough to pay."""
    from drafttree.budget import CostModel, TreeBudget
    from drafttree.drafters.base import DraftRequest

    curve = CostModel([1, 2, 4, 8], [0.002, 0.0021, 0.0022, 0.0024])

    class Barred(ConstantSource):
        """Proposes only where its first token's estimate reaches the round's bar, as the n-gram source does."""

        def propose(self, rc, index):
            return None if self.calibration.rate_of(0) < rc.min_accept else super().propose(rc, index)

    def drafter(prior: float, greedy_gate: bool) -> HybridDrafter:
        hd = HybridDrafter([Barred([3, 4], prior=prior), ConstantSource([5], prior=0.9)],
                           budget=TreeBudget(curve, max_total=8, min_total=1))
        hd.greedy_draft_gate.enabled = greedy_gate
        hd.round_seconds = 0.003  # a round's drafting: 1.5 one-token forwards
        hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
        return hd

    def sizes(hd: HybridDrafter, rounds: int, accepted) -> list[int]:
        out = []
        for r in range(rounds):
            out.append(hd.propose(DraftRequest([1, 2, 2], 2, 8, Sampling(), None)).size)
            hd.observe(accepted(r), torch.zeros(2, 4), 7)
        return out

    half = lambda r: [2, 3] if r % 2 else [2]  # noqa: E731 - the first draft accepted every other round
    closing = drafter(0.5, True)
    gated = sizes(closing, 60, half)
    assert sum(n > 1 for n in gated[-20:]) <= 6, gated  # closed: plain rounds, with a probe now and then
    # a round after a gated round that accepted nothing is its own situation (2), learnt apart from a miss (0): else a
    # gate closed after a miss stays closed until a probe, a plain round being a miss too
    assert {0, 1, 2} <= set(closing.greedy_draft_gate.gain), closing.greedy_draft_gate.gain
    assert all(n > 1 for n in sizes(drafter(0.5, False), 40, half)[-20:])  # without the gate: every round drafts
    strong = drafter(0.5, True)
    sizes(strong, 40, half)
    strong.round_seconds = 0.0005  # a cheaper round: the bar is (0.1 + 0.5) / 2 ms = 0.3
    strong.sources[0].calibration.prior.fill_(0.97)  # the first source now expects its first token to be accepted
    strong.sources[0].calibration.hits.zero_()
    strong.sources[0].calibration.trials.zero_()
    trees = []
    for _ in range(3):
        trees.append(strong.propose(DraftRequest([1, 2, 2], 2, 8, Sampling(), None)))
        strong.observe([2], torch.zeros(1, 4), 7)
    assert all(t.size > 1 and 5 not in t.tokens.tolist() for t in trees)  # the first source's nodes only


def test_a_costly_source_slower_than_modelled_is_charged_what_the_clock_says():
    """A costly source modelled at 0.1 forwards a level that takes 8x that here (a small head's forward is bound by
    per-call overhead, not by the bytes it reads): its ``clock`` learns the ratio and its gate closes where its half an
    accepted token a round pays for the modelled cost but not the real one; ``clock_cost=False`` keeps it open."""
    import time as time_module

    from drafttree.budget import CostModel, TreeBudget
    from drafttree.drafters.base import DraftRequest

    curve = CostModel([1, 2, 4, 8], [0.002, 0.0021, 0.0022, 0.0024])  # one-token forward 2 ms

    class SlowModelSource(ConstantSource):
        name = "slow"

        def __init__(self, chain):
            super().__init__(chain, prior=0.6)
            self.modelled_cost, self.clock = 0.1, 1.0

        @property
        def cost(self):
            return self.modelled_cost * self.clock

        @cost.setter
        def cost(self, value):
            self.modelled_cost = value

        def propose(self, rc, index):
            time_module.sleep(0.0016)  # 1.6 ms = 0.8 forwards, 8x the modelled 0.1
            prop = super().propose(rc, index)
            prop.spent = self.cost
            return prop

    def run(clock_cost: bool) -> tuple[float, int]:
        src = SlowModelSource([3, 4])
        hd = HybridDrafter([src], budget=TreeBudget(curve, max_total=8, min_total=1), clock_cost=clock_cost)
        hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
        late = 0
        for r in range(60):
            tree = hd.propose(DraftRequest([1, 2, 2], 2, 8, Sampling(), None))
            late += r >= 40 and tree.size > 1
            hd.observe([2, 3] if r % 2 else [2], torch.zeros(2, 4), 7)  # half an accepted draft a round
        return src.clock, late

    clock_on, drafted_on = run(True)
    clock_off, drafted_off = run(False)
    assert clock_on > 4 and clock_off == 1.0
    assert drafted_off >= 15 and drafted_on <= 5, (drafted_on, drafted_off)
