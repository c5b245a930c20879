"""The verify-cost curve corrected by decoding's own verify times (live_curve.py), and its place in the decode loop."""

from __future__ import annotations

import math

import pytest
import torch

from drafttree.accept import Sampling
from drafttree.budget import BudgetRounds, CostModel, TreeBudget
from drafttree.drafters.base import Drafter, DraftRequest
from drafttree.drafters.hybrid import HybridDrafter
from drafttree.live_curve import LiveCurve
from tests.constant_source import ConstantSource

CACHED = CostModel([1, 2, 4, 8, 16], [1.0, 1.1, 1.2, 1.3, 2.0])


def test_the_curve_follows_the_sizes_it_sees_and_extends_their_correction_to_the_rest():
    live = LiveCurve(CACHED, every=4)
    assert live.curve is CACHED and live.corrected() is CACHED  # nothing seen: the cached curve
    for _ in range(20):  # one-token forwards 20% faster than cached, 8 and 9 tokens twice as slow
        live.observe(1, 0, 0.8)
        live.observe(8, 0, 2.6)
        live.observe(9, 0, 2 * CACHED.verify(9))
    c = live.curve
    assert math.isclose(c.verify(1), 0.8, rel_tol=1e-6) and math.isclose(c.verify(8), 2.6, rel_tol=1e-6)
    assert math.isclose(c.verify(2), 0.88, rel_tol=1e-6)  # unseen: the correction of the nearest seen point below
    assert math.isclose(c.verify(16), 4.0, rel_tol=1e-6)  # beyond the largest seen: its correction too
    assert all(b >= a for a, b in zip(c.seconds, c.seconds[1:]))
    assert live.ratios()[0] is not None and live.ratios()[1] is None


def test_one_stall_moves_a_point_by_at_most_the_clip_and_is_then_averaged_away():
    live = LiveCurve(CACHED, every=1, clip=0.5)
    for _ in range(10):
        live.observe(4, 0, 1.2)
    live.observe(4, 0, 100.0)  # a 80x stall
    assert live.curve.verify(4) < 1.2 * math.exp(0.5 / 11) + 1e-9
    for _ in range(100):
        live.observe(4, 0, 1.2)
    assert math.isclose(live.curve.verify(4), 1.2, rel_tol=0.01)


def test_the_correction_is_relative_to_the_curve_at_the_forwards_context():
    curve = CostModel([1, 2, 4, 8], [1.0, 1.1, 1.3, 1.7], context=256, per_key=2e-4)
    live = LiveCurve(curve, every=1)
    for _ in range(5):  # exactly what the cached curve predicts over a long context: no correction
        live.observe(8, 2048, curve.at(2048).verify(8))
    assert math.isclose(live.curve.verify(8), 1.7, rel_tol=1e-9)


def _sizes(live: bool, rounds: int = 40) -> list[int]:
    """Tree sizes of a hybrid drafter whose trees cost (as timed) far more than its cached curve says."""
    cheap = CostModel([1, 2, 4, 8], [1.0, 1.02, 1.04, 1.08])  # trees look nearly free
    truth = CostModel([1, 2, 4, 8], [1.0, 1.05, 1.95, 2.1])  # past 2 tokens each costs far more: 2 pays best
    budget = TreeBudget(cheap, max_total=8, min_total=1)
    hd = HybridDrafter([ConstantSource([3, 4, 5, 6, 7], prior=0.6)], budget=budget,
                       live=LiveCurve(cheap, every=4) if live else None)
    hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
    sizes = []
    for _ in range(rounds):
        tree = hd.propose(DraftRequest([1, 2, 2], 2, 8, Sampling(), None))
        sizes.append(tree.size)
        hd.verified(tree.size, 3, truth.verify(tree.size))
        hd.observe([2, 3] if tree.size > 1 else [2], torch.zeros(2, 4), 7)
    return sizes


def test_a_hybrid_drafter_with_a_live_curve_shrinks_trees_that_cost_more_than_cached():
    fixed, live = _sizes(False), _sizes(True)
    assert fixed[0] == live[0] > 2  # the same start: the cached curve
    assert set(fixed) == {fixed[0]}, fixed  # the cached curve alone never learns the trees are dear
    late = live[8:]  # (the calibration still moves, so now and then a bigger tree pays again)
    assert late.count(2) > 0.6 * len(late) and sum(late) / len(late) < 0.6 * fixed[0], live


class Recording(Drafter):
    name = "recording"

    def __init__(self):
        self.calls: list[tuple[int, int, float]] = []

    def verified(self, tokens: int, context: int, seconds: float) -> None:
        self.calls.append((tokens, context, seconds))


def test_the_decode_loop_reports_each_rounds_verify_forward():
    from drafttree.decode import decode
    from drafttree.target import TargetModel
    from tests.conftest import tiny_causal_lm

    prompt = torch.tensor([5, 6, 7, 8])
    d = Recording()
    out = [t for step in decode(TargetModel(tiny_causal_lm()), d, prompt, Sampling(), 6) for t in step]
    assert len(out) == 6 and len(d.calls) == 5  # the prefill's token, then one forward per token
    assert [c[0] for c in d.calls] == [1] * 5
    assert [c[1] for c in d.calls] == [5, 6, 7, 8, 9]  # the prompt and the tokens so far, root included
    assert all(c[2] > 0 for c in d.calls)


def test_the_live_curve_is_an_option_of_the_composition_on_by_default():
    from drafttree.drafters import make_drafter
    from drafttree.models import LoadedModel
    from tests.conftest import tiny_causal_lm

    tl = LoadedModel(tiny_causal_lm("llama", vocab=40, hidden=32, seed=3), None, "tiny", "")
    on, off = (make_drafter("hybrid", tl, None, None, sources="ngram", **kw) for kw in ({}, {"live_curve": False}))
    assert on.live is not None and on.base_cost is on.live.curve and off.live is None
    fixed = make_drafter("hybrid", tl, None, None, sources="ngram", total_tokens=4)
    assert fixed.live is None  # a fixed tree size reads no curve


def test_budget_rounds_size_by_the_live_curve():
    rounds = BudgetRounds(TreeBudget(CACHED, max_total=8), LiveCurve(CACHED, every=1))
    for _ in range(3):
        rounds.verified(4, 0, 2.4)  # twice the cached 1.2
    assert math.isclose(rounds.start(None, 0).cost.verify(4), 2.4, rel_tol=1e-9)
    plain = BudgetRounds(TreeBudget(CACHED, max_total=8))
    plain.verified(4, 0, 2.4)  # without a live curve: nothing to correct
    assert plain.start(None, 0).cost.verify(4) == 1.2


def test_eagle2_and_draft_lm_trees_take_the_live_curve_and_the_batch_reports_a_lone_row():
    from drafttree.batching import BatchDecoder, BatchTarget, Sequence
    from drafttree.drafters import make_drafter
    from drafttree.heads.model import EagleHead
    from drafttree.models import LoadedModel
    from tests.conftest import tiny_causal_lm

    lm = tiny_causal_lm("llama", vocab=40, hidden=32, seed=3)
    tl = LoadedModel(lm, None, "tiny", "")
    draft = LoadedModel(tiny_causal_lm("llama", vocab=40, hidden=32, seed=4), None, "tiny-draft", "")
    head = EagleHead(lm)
    on, off = (make_drafter("eagle2", tl, None, head, **kw) for kw in ({}, {"live_curve": False}))
    assert on.shape.rounds.live is not None and off.shape.rounds.live is None
    on, off = (make_drafter("draft", tl, draft, None, tree=True, total_tokens="auto", **kw)
               for kw in ({}, {"live_curve": False}))
    assert on.rounds.live is not None and off.rounds.live is None
    d = Recording()
    dec = BatchDecoder(BatchTarget(lm), None)
    dec.add(Sequence(torch.tensor([5, 6, 7]), d, Sampling(), 4))
    while dec.rows:
        dec.step()
    assert [c[:2] for c in d.calls] == [(1, 4), (1, 5), (1, 6)] and all(c[2] > 0 for c in d.calls)


def test_a_curve_interpolates_between_its_points_and_answers_the_same_twice():
    """verify(n): the measured point, linear between points, proportional beyond the last, the first below it; a
    memoised answer is the computed one (the budget asks for the same sizes thousands of times a generation)."""
    cm = CostModel([1, 4, 8], [0.010, 0.016, 0.024])
    expect = {0: 0.010, 1: 0.010, 2: 0.012, 4: 0.016, 6: 0.020, 8: 0.024, 16: 0.048}
    for _ in range(2):
        for n, v in expect.items():
            assert cm.verify(n) == pytest.approx(v, rel=1e-12), n
    keyed = CostModel([1, 4, 8], [0.010, 0.016, 0.024], per_key=1e-6)
    assert keyed.verify(4) == pytest.approx(0.016)
    longer = keyed.at(1000)  # another curve (each token attends over 1,000 more keys), with its own answers
    assert longer.verify(4) == pytest.approx(0.016 + 4 * 1e-6 * 1024) and keyed.verify(4) == pytest.approx(0.016)
