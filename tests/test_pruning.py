"""What a deeper draft level must beat (``budget.best_tree``), how wide it is drafted, and the head's catch-up
after a closed gate: what sizes a round and what its gates weigh."""

from __future__ import annotations

import pytest
import torch

from drafttree.accept import Sampling
from drafttree.drafters.hybrid import HybridDrafter
from drafttree.sources.base import RoundContext
from tests.conftest import tiny_causal_lm
from tests.constant_source import ConstantSource
from tests.test_hybrid_distribution import PROMPT, VOCAB


class PeakedStepper:
    """Fake drafter whose top guess holds ``top`` of the probability, children by the token only."""

    vocab_ids = None

    def __init__(self, top: float, vocab: int = 20, second: float = 0.0):
        rest = (1 - top - second) / (vocab - (2 if second else 1))
        row = torch.full((vocab,), rest)
        row[0] = top
        if second:  # an unsure drafter: two guesses share the mass
            row[1] = second
        self.table = torch.stack([row.roll(i) for i in range(vocab)]).log()
        self.widths: list[int] = []

    def root_logprobs(self):
        return self.table[3]

    def expand(self, tokens, parent_slots, attend, depth):
        self.widths.append(int(tokens.numel()))
        return self.table[tokens]


@pytest.mark.parametrize("top, second, cost, chain", [(0.95, 0.0, 0.15, True), (0.95, 0.0, 0.001, True),
                                                     (0.5, 0.45, 0.02, False), (0.5, 0.45, 0.001, False)])
def test_a_costly_source_drafts_a_chain_where_its_top_guess_carries_the_mass(top, second, cost, chain):
    """Each level is drafted at the width that pays on the cost curve: width 1 for a confident drafter, however
    cheap (the children of its unlikely second guesses would cost more to verify than they bring), wider for an
    unsure one (whose second guesses are worth drafting below)."""
    from drafttree.sources.model_sources import ExpandingSource

    class Source(ExpandingSource):
        def _stepper(self, rc):
            return self.stepper

    curve = lambda n: 1.0 + 0.05 * (n - 1)  # noqa: E731 (8 tokens cost 1.35 single ones, as on a CPU)
    src = Source(top_k=4, depth=6, max_total=32, cost_curve=curve)
    src.cost, src.stepper = cost, PeakedStepper(top, second=second)
    prop = src.propose(RoundContext([1, 3], 3, 6, Sampling(), []), 0)
    widths = src.stepper.widths
    assert widths, "a likely next level must be drafted"
    assert (max(widths) == 1) == chain, widths
    assert prop.spent == pytest.approx(cost + sum(cost * curve(w) for w in widths))


@pytest.mark.parametrize("rule, drafted", [("best", False), ("all", True)])
def test_a_deeper_level_must_beat_the_best_tree_not_every_candidate(rule, drafted):
    """A level that costs 0.3 forwards for ~0.37 expected tokens does not pay against the best tree now (the root and
    its likely child: ~1.3 tokens per forward); weighed against the tree of all four candidates (three near-certain
    misses verified too), the old rule's, it looked as if it did."""
    from drafttree.sources.model_sources import ExpandingSource

    class Source(ExpandingSource):
        def _stepper(self, rc):
            return self.stepper

    curve = lambda n: 1.0 + 0.05 * (n - 1)  # noqa: E731
    # explore=0: the level's rate is the prior's 1/2 here, not the optimistic reading of an untested level
    src = Source(top_k=4, depth=6, max_total=32, cost_curve=curve, prune_against=rule, explore=0.0)
    src.cost, src.stepper = 0.3, PeakedStepper(0.95)
    src.propose(RoundContext([1, 3], 3, 6, Sampling(), []), 0)
    assert bool(src.stepper.widths) == drafted, src.stepper.widths


def test_best_tree_picks_the_prefix_with_the_best_rate():
    from drafttree.budget import CostModel, best_tree, joining

    cost = CostModel([1, 2, 4, 8], [1.0, 1.1, 1.3, 1.7])
    scores = torch.tensor([0.9, 0.5, 0.01, 0.01, 0.01]).log()
    n, e, t = best_tree(scores, 0.0, cost.verify, 63)
    rates = [(1 + float(scores[:k].exp().sum())) / cost.verify(k + 1) for k in range(6)]
    assert n == max(range(6), key=rates.__getitem__) == 2
    assert e == pytest.approx(2.4) and t == pytest.approx(cost.verify(3))
    assert best_tree(scores, 0.0, cost.verify, 63, rule="all")[0] == 5
    assert best_tree(scores, 0.0, cost.verify, 1)[0] == 1  # at most max_nodes candidates
    assert joining([0.5, 0.01, 0.9], [0.9, 0.5, 0.01], 2) == [1, 3, 4]  # an expanded node outside the best 2 joins


@pytest.mark.parametrize("rule, level, deeper", [("best", 0.6, False), ("all", 0.6, True), ("best", 0.2, True)])
def test_eagle2_weighs_a_level_against_the_best_tree(rule, level, deeper):
    """EAGLE-2's budget: a level costing 0.6 steps for its likely node's child does not pay against the root and
    that node (1.9 tokens for 1.05 steps), only against the tree of all eight candidates; at 0.2 steps it does."""
    from drafttree.budget import CostModel, TreeBudget

    budget = TreeBudget(CostModel([1, 2, 4, 8, 16], [1.0, 1.05, 1.15, 1.35, 1.75]), prune_against=rule)
    best = torch.tensor([0.9] + [0.003] * 7).log()
    assert budget.worth_deeper(best, best[:1], 0.0, level) == deeper


def test_the_head_charges_the_catch_up_of_the_rounds_it_skipped():
    """A head that drafts after a closed gate's wait first encodes every pair committed meanwhile, in one forward
    over them all: the round's drafting cost (what sizes its tree) grows with that backlog, and what exceeds one
    round's pairs is marked as catch-up (which the gates do not hold against drafting)."""
    from drafttree.heads.model import EagleHead
    from drafttree.sources.base import RoundContext
    from drafttree.sources.model_sources import HeadSource

    target = tiny_causal_lm("llama", vocab=VOCAB, hidden=32, seed=0)
    torch.manual_seed(5)
    head = EagleHead(target)

    def curve(n: int) -> float:  # relative verify cost: 16 tokens cost 2.5 one
        return 1.0 + 0.1 * (n - 1)

    spent, catch_up = {}, {}
    for skipped in (0, 15):
        src = HeadSource(head, top_k=2, depth=2, max_total=8, cost_curve=curve)
        src.begin(torch.tensor(PROMPT[:2]), torch.randn(2, 32), 3)
        src.propose(RoundContext(PROMPT[:2] + [3], 3, 2, Sampling(), []), 0)  # encodes the prompt
        for i in range(skipped):  # rounds in which the gate kept the head closed: pairs only queue
            src.observe([3 + i % 5], torch.randn(1, 32), 4)
        prop = src.propose(RoundContext(PROMPT[:2] + [3] * (skipped + 1), 4, 2, Sampling(), []), 0)
        spent[skipped], catch_up[skipped] = prop.spent, prop.catch_up
    assert abs(spent[15] - spent[0] - (src.level_cost(15) - src.cost)) < 1e-9 and spent[15] > spent[0]
    assert catch_up[0] == 0.0 and catch_up[15] == pytest.approx(src.level_cost(15) - src.level_cost(1))


def test_the_gates_weigh_a_round_without_its_catch_up():
    """A costly source's gate records the round's drafting cost less its catch-up."""
    from drafttree.budget import CostModel, TreeBudget
    from drafttree.drafters.base import DraftRequest

    class CatchingUp(ConstantSource):
        def propose(self, rc, index):
            prop = super().propose(rc, index)
            prop.spent, prop.catch_up = 1.0, 0.75
            return prop

    budget = TreeBudget(CostModel([1, 2, 4, 8], [1.0, 1.2, 1.5, 2.0]), max_total=8, min_total=1)
    hd = HybridDrafter([CatchingUp([3, 4, 5], cost=0.1)], budget=budget)
    hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
    hd.propose(DraftRequest([1, 2, 2], 2, 8, Sampling(), None))
    hd.observe([2, 3], torch.zeros(2, 4), 7)
    assert list(hd.gates[0].cost.values()) == [pytest.approx(0.25)]


def test_a_level_rate_counts_tested_parents_and_an_undrafted_level_reads_as_the_one_above():
    """What expanding a node is worth is P(one of its children is accepted | it was): three siblings tested beside
    the accepted child must not dilute it to a third, and a depth the source never drafted must not read as a coin
    toss (stop 42's L diagnostic: the draft LM drafted one level a round forever, its depth 2 stuck at the prior)."""
    from drafttree.sources.base import Calibration

    cal = Calibration(torch.full((8,), 0.5), levels=4)
    assert cal.level_rate(0) == pytest.approx(0.5) and cal.level_rate(3) == pytest.approx(0.5)
    for _ in range(20):  # each round: the root's four children tested, the first accepted
        cal.update_levels([0, 0, 0, 0], [0, 0, 0, 0], [True, False, False, False])
    assert cal.level_rate(0) == pytest.approx(21 / 22)
    assert cal.level_rate(1) > 0.9 and cal.level_rate(3) > 0.9, "undrafted depths inherit the depth above"
    for _ in range(20):  # depth 2: two parents tested, one child accepted below one of them
        cal.update_levels([1, 1, 1], [5, 5, 6], [True, False, False])
    assert cal.level_rate(1) == pytest.approx((20 + 2 * 21 / 22) / (40 + 2))
    tests = list(cal.level_tests)
    cal.update_levels([2, 2], [9, 9], [True, True])  # one node proposed twice by the source: one test, one hit
    assert cal.level_tests[2] == tests[2] + 1 and cal.level_hits[2] == 1.0
    cal.decay(0.5)
    assert cal.level_tests == pytest.approx([10.0, 20.0, 0.5, 0.0])
    assert cal.fresh().level_tests == [0.0] * 4


def test_the_hybrid_teaches_a_model_source_its_level_rates_per_tested_parent():
    """After verification the hybrid passes each model source's tested nodes with their parents: a chain of three
    accepted drafts is one test and one hit at each of its levels, whatever else was verified beside it."""
    from drafttree.budget import CostModel, TreeBudget
    from drafttree.drafters.base import DraftRequest
    from drafttree.sources.model_sources import ExpandingSource

    class Source(ExpandingSource):
        def _stepper(self, rc):
            return self.stepper

        def begin(self, *a):
            pass

        def observe(self, *a):
            pass

    src = Source(top_k=2, depth=3, max_total=16, cost_curve=lambda n: 1.0)
    src.cost, src.stepper = 0.0, PeakedStepper(0.95)
    budget = TreeBudget(CostModel([1, 2, 4, 8, 16], [1.0, 1.0, 1.0, 1.0, 1.0]), max_total=16, min_total=1)
    hd = HybridDrafter([src], budget=budget, gate=False)
    hd.begin(torch.tensor([1, 3]), torch.zeros(2, 4), 3)
    req = DraftRequest([1, 3], 3, 3, Sampling(), None)
    tree = hd.propose(req)
    assert tree.max_depth == 3 and tree.size > 4, "a confident, free source drafts three levels, siblings too"
    hd.observe([3, 3, 3, 3], torch.zeros(4, 4), 3)  # PeakedStepper's top guess after 3 is 3: all three accepted
    cal = src.calibration
    assert cal.level_tests[:3] == [1.0, 1.0, 1.0] and cal.level_hits[:3] == [1.0, 1.0, 1.0]
    # the pruner asks the rate of the depth it would draft next (1-based, depth 4 and deeper one bucket)
    assert src.level_rate(2) == cal.level_rate(1, explore=src.explore)
    assert src.level_rate(9) == cal.level_rate(3, explore=src.explore)
    assert float(cal.trials.sum()) > 3, "the siblings still teach the probability cells"


def test_a_cached_cost_curve_is_read_once_per_process_and_again_when_its_file_changes(tmp_path, monkeypatch):
    """A server builds a drafter per request: the curve must not be re-read (and its memo lost) each time."""
    import json
    import os
    from types import SimpleNamespace

    from drafttree import budget
    from drafttree.budget import calibration_path, cost_model_for

    monkeypatch.setattr(budget, "calibration_dir", lambda: tmp_path / "calibration")  # the kernel stays put
    runner = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32,
                             config=SimpleNamespace(num_hidden_layers=2, hidden_size=8))
    path = calibration_path(runner, "m")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"sizes": [1, 8], "seconds": [0.01, 0.02]}))
    first = cost_model_for(runner, "m", quiet=True)
    assert cost_model_for(runner, "m", quiet=True) is first and first.verify(8) == 0.02
    path.write_text(json.dumps({"sizes": [1, 8], "seconds": [0.01, 0.03]}))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a re-calibration, a second later
    assert cost_model_for(runner, "m", quiet=True).verify(8) == 0.03


def test_two_processes_needing_a_curve_at_once_measure_it_once(tmp_path, monkeypatch):
    """Two servers (or test workers) starting together: one measures, the other waits for its file and reads it
    (not timing forwards against the first's), and nobody reads half a file."""
    import threading
    import time
    from types import SimpleNamespace

    from drafttree import budget

    monkeypatch.setattr(budget, "calibration_dir", lambda: tmp_path / "calibration")  # the kernel stays put
    runner = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32,
                             config=SimpleNamespace(num_hidden_layers=2, hidden_size=8))
    calls = []

    def slow_measure(r, show_progress=False):
        calls.append(threading.get_ident())
        time.sleep(0.3)
        return budget.CostModel([1, 8], [0.01, 0.02 + len(calls)])

    monkeypatch.setattr(budget, "measure_verify_costs", slow_measure)
    monkeypatch.setattr(budget, "_LOADED", {})
    got = []
    workers = [threading.Thread(target=lambda: got.append(budget.cost_model_for(runner, "m", quiet=True)))
               for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(calls) == 1, "the second process measured again instead of reading the first's curve"
    assert [c.verify(8) for c in got] == [1.02, 1.02]
    assert list(budget.calibration_path(runner, "m").parent.glob("*.tmp")) == []


def test_a_seldom_tested_level_reads_optimistic_and_a_well_tested_one_as_it_is():
    """One early miss at a level a source seldom reaches must not keep it from drafting that level for a whole
    generation (stop 48, HumanEval #12 at L: depth 3 read 0.65 from one test while the draft LM's chains of four
    were all accepted in 75% of rounds); with ``explore`` the rate reads that many standard errors high, a bonus
    that shrinks as the level is tested, and without it the rate is the plain estimate."""
    from drafttree.sources.base import Calibration

    cal = Calibration(torch.full((8,), 0.5), levels=4)
    for _ in range(60):
        cal.update_levels([0, 1], [0, 1], [True, True])
    cal.update_levels([2], [3], [False])  # depth 3: one test, missed
    plain = cal.level_rate(2)
    assert plain < 0.7
    bold = cal.level_rate(2, explore=1.0)
    assert bold == pytest.approx(plain + (plain * (1 - plain) / 3) ** 0.5) and bold > 0.9
    assert cal.level_rate(1, explore=1.0) - cal.level_rate(1) < 0.02  # 60 tests: next to no bonus
    for _ in range(200):  # depth 3 tested often, accepted half the time: the bonus fades
        cal.update_levels([2], [3], [bool(_ % 2)])
    assert cal.level_rate(2, explore=1.0) - cal.level_rate(2) < 0.04
    assert cal.level_rate(2, explore=1.0) <= 1.0


@pytest.mark.parametrize("explore, deeper", [(0.0, False), (1.0, True)])
def test_after_one_early_miss_only_the_optimistic_rule_drafts_that_level_again(explore, deeper):
    """The L diagnostic's situation in small: a confident source (0.97 a node), depths 1-2 always accepted, depth 3
    tested once and missed. Read as it is (0.66), a third level does not pay for a costly drafter's call; read one
    standard error high (0.93) it does, so the level is drafted (and re-learned) instead of abandoned."""
    from drafttree.sources.model_sources import PROB_EDGES, ExpandingSource

    class Source(ExpandingSource):
        def _stepper(self, rc):
            return self.stepper

    curve = lambda n: 1.0 + 0.05 * (n - 1)  # noqa: E731
    src = Source(top_k=4, depth=6, max_total=32, cost_curve=curve, explore=explore)
    src.cost, src.stepper = 0.5, PeakedStepper(0.99)
    cal = src.calibration
    top_bin = PROB_EDGES.numel()  # p = 0.99 falls in the last bin, at every depth
    for depth in range(4):
        cal.prior[depth * (PROB_EDGES.numel() + 1) + top_bin] = 0.97
    for _ in range(60):
        cal.update_levels([0, 1], [0, 1], [True, True])
    cal.update_levels([2], [2], [False])
    src.propose(RoundContext([1, 3], 3, 6, Sampling(), []), 0)
    # levels drafted below the root's children: depth 2 either way, depth 3 (and, untested, on) only when optimistic
    assert (len(src.stepper.widths) > 1) == deeper and src.stepper.widths[0] == 1, src.stepper.widths


def test_model_sources_take_the_exploration_option():
    from drafttree.drafters.options import HybridOptions, parse_options
    from drafttree.errors import DraftTreeError
    from drafttree.sources.model_sources import EXPLORE

    assert parse_options(HybridOptions, "auto", {"explore": "1.5"}).explore == 1.5
    assert parse_options(HybridOptions, "auto", {}).explore == EXPLORE == 0.0
    with pytest.raises(DraftTreeError):
        parse_options(HybridOptions, "auto", {"explore": "-1"})


def test_a_batch_reads_no_token_past_the_compute_bound_size_as_cheaper_than_the_cheapest_measured():
    """A measured curve that dips by noise past its compute-bound size (here 12 -> 16 tokens: 1 ms a token against
    4-5 elsewhere) is floored in a batch: each token past it costs at least the curve's mean added cost per token from
    there; a lone sequence's curve (unless the option asks) and sizes below the bound are as measured; vectorised and
    scalar agree; a row's BatchShare reads the floored curve."""
    from drafttree.budget import BatchShare, CostModel

    cpu = CostModel([1, 2, 4, 8, 12, 16, 24, 32], [0.020, 0.021, 0.024, 0.036, 0.052, 0.056, 0.092, 0.120])
    k, c = cpu.compute_bound()
    assert k == 8 and c == pytest.approx((0.120 - 0.036) / 24)  # from 8 tokens on, 3.5 ms a token on the mean
    assert cpu.verify_in_batch(16) == pytest.approx(0.052 + 4 * c) and cpu.verify_in_batch(16) > cpu.verify(16)
    for n in (1, 2, 3, 4, 8, 12):
        assert cpu.verify_in_batch(n) == pytest.approx(cpu.verify(n))
    for n in range(9, 40):  # never below the measured curve, and each token past K adds at least c
        assert cpu.verify_in_batch(n) >= cpu.verify(n) - 1e-12
        assert cpu.verify_in_batch(n + 1) - cpu.verify_in_batch(n) >= c - 1e-12
    ns = torch.arange(1, 40)
    assert torch.allclose(cpu.verify_many_in_batch(ns), torch.tensor([cpu.verify_in_batch(int(n)) for n in ns],
                                                                     dtype=torch.float64))
    share = BatchShare(cpu, others=11, rows=12, others_tokens=11.0)
    assert share.verify(5) == cpu.verify_in_batch(16) and share.verify(5) > cpu.verify(16)
    # a node that is certain but only pays against the dip: with the floor a 12-row batch's certain node still pays,
    # one at 60% does not
    g = 12.0
    assert (g + 1.0) / share.verify(2) > g / share.verify(1) and (g + 0.6) / share.verify(2) < g / share.verify(1)
    from drafttree.drafters.options import HybridOptions, parse_options

    assert parse_options(HybridOptions, "auto", {"floored_curve": "true"}).floored_curve
    assert not parse_options(HybridOptions, "auto", {}).floored_curve
    lone = cpu.floored()  # the option `floored_curve` gives a lone sequence the same floor at the measured sizes
    assert lone.sizes == cpu.sizes and lone.seconds == [cpu.verify_in_batch(n) for n in cpu.sizes]
    assert lone.verify(16) > cpu.verify(16) and lone.verify(4) == cpu.verify(4)
    flat = CostModel([1, 8, 32, 96], [0.010, 0.010, 0.011, 0.020])  # a GPU: per token cheapest at the largest size
    fixed = CostModel([1, 2, 16, 17, 18], [1.0, 1.05, 1.6, 1.65, 1.7])  # past 16 tokens 0.05 each, far below the mean
    for curve in (flat, fixed):
        assert curve.compute_bound() is None and all(curve.verify_in_batch(n) == curve.verify(n) for n in range(1, 97))
