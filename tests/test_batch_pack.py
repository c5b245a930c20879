"""A batch keeps its best draft nodes over every row (batching/decode.py: pack_counts, HybridDrafter.ranked/shrink).

Expectations are computed by hand from the curves written here, or by brute force over every way of taking a prefix
of each row's ranked nodes, not by the code under test."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from drafttree.accept import Sampling
from drafttree.batching.decode import pack_counts
from drafttree.budget import BatchShare, CostModel, TreeBudget
from drafttree.drafters.base import DraftRequest
from drafttree.drafters.hybrid import HybridDrafter
from drafttree.sources.ngram import NgramSource


def staircase(t: int) -> float:
    """A forward's cost on tiles of 16 rows: flat within a block, a step at 17 and at 33."""
    return 10.0 if t <= 16 else (12.0 if t <= 32 else 30.0)


def test_a_full_block_of_rows_takes_the_next_block_only_when_it_pays():
    # 16 rows, two 0.9 nodes each: 16 of them fill the second block (16 + 14.4) / 12 = 2.53 > 16 / 10; all 32 would
    # need a third block, (16 + 28.8) / 30 = 1.49
    counts = pack_counts([[0.9, 0.9]] * 16, [3] * 16, [0.0] * 16, staircase, [0.0] * 16)
    assert sum(counts) == 16 and all(c in (0, 2) for c in counts)
    # nodes of 0.2: (16 + 16 * 0.2) / 12 = 1.6 = 16 / 10, not better: roots only
    assert pack_counts([[0.2, 0.2]] * 16, [3] * 16, [0.0] * 16, staircase, [0.0] * 16) == [0] * 16


def test_a_batch_short_of_a_block_fills_it_with_the_best_nodes_of_any_row():
    ranked = [[0.95, 0.5, 0.1], [0.8, 0.7, 0.6, 0.05], [0.3], [0.99, 0.98, 0.97, 0.96, 0.9, 0.4, 0.35, 0.33, 0.31]]
    # 4 roots: 12 nodes fit in the first block for free; the 12 best are 0.99 .. 0.35 (0.33, 0.31, 0.3, 0.1, 0.05 left
    # out); a 13th would cost the step to 12: (4 + 9.1 + 0.33) / 12 = 1.12 < (4 + 9.1) / 10 = 1.31
    counts = pack_counts(ranked, [len(r) + 1 for r in ranked], [0.0] * 4, staircase, [0.0] * 4)
    assert counts == [2, 3, 0, 7]


def test_rows_that_do_not_rank_are_verified_whole_and_count_in_the_forward():
    # a fixed tree of 13 tokens (expected 2 accepted) and 3 ranked rows: 16 tokens already, so a ranked node costs the
    # step; three 0.3 nodes: (4 + 2 + 0.9) / 12 = 0.575 < 6 / 10; three 0.9 nodes: (4 + 2 + 2.7) / 12 = 0.725 > 0.6
    counts = pack_counts([None, [0.3], [0.3], [0.3]], [13, 2, 2, 2], [2.0, 0, 0, 0], staircase, [0.0] * 4)
    assert counts == [0, 0, 0, 0]
    assert pack_counts([None, [0.9], [0.9], [0.9]], [13, 2, 2, 2], [2.0, 0, 0, 0], staircase, [0.0] * 4) == [0, 1, 1, 1]
    # a fixed tree of 10 tokens: 3 free slots left, taken even by 0.3 nodes
    assert pack_counts([None, [0.3], [0.3], [0.3]], [10, 2, 2, 2], [2.0, 0, 0, 0], staircase, [0.0] * 4) == [0, 1, 1, 1]


def test_a_rows_cost_per_node_weighs_against_its_nodes():
    # two rows of 0.5 nodes on a flat curve: a node pays while 0.5 / per_node beats the round's rate
    flat = lambda t: 1.0  # noqa: E731
    # row 0 over a long context: each node 0.5 more; (2 + 0.5) / 1.5 = 1.67 < 2 / 1 -> none of row 0's; row 1's free
    assert pack_counts([[0.5, 0.5], [0.5, 0.5]], [3, 3], [0, 0], flat, [0.5, 0.0]) == [0, 2]


@pytest.mark.parametrize("seed", range(20))
def test_the_packs_choice_is_the_best_of_every_prefix_per_row(seed):
    rng = random.Random(seed)
    rows = rng.randint(1, 4)
    ranked = [sorted((rng.random() for _ in range(rng.randint(0, 4))), reverse=True) for _ in range(rows)]
    step, block = rng.uniform(0.2, 2.0), rng.randint(1, 8)

    def verify(t: int) -> float:  # a staircase of random blocks and steps
        return 1.0 + step * ((t - 1) // block)

    got = pack_counts(ranked, [len(r) + 1 for r in ranked], [0.0] * rows, verify, [0.0] * rows)

    def rate(ks):
        return (rows + sum(sum(r[:k]) for r, k in zip(ranked, ks))) / verify(rows + sum(ks))

    best = max(rate(ks) for ks in itertools.product(*[range(len(r) + 1) for r in ranked]))
    assert rate(got) == pytest.approx(best, rel=1e-12)


def _drafter(**kw) -> HybridDrafter:
    curve = CostModel([1, 16, 17, 32], [1.0, 1.0, 2.0, 2.0])
    return HybridDrafter([NgramSource()], budget=TreeBudget(curve, max_total=16, min_total=1), **kw)


def _request(context: list[int], cost) -> DraftRequest:
    return DraftRequest(context, context[-1], 8, Sampling(), None, cost=cost)


CONTEXT = [5, 6, 7, 8, 9, 10, 11, 12] * 4 + [5, 6, 7]


def test_a_packed_row_ranks_its_nodes_and_shrinks_to_its_best():
    d = _drafter()  # a batch of 4 rows on tiles of 16: 12 nodes come free, so every node the n-grams find is offered
    d.begin(torch.tensor(CONTEXT[:-1]), torch.zeros(len(CONTEXT) - 1, 4), CONTEXT[-1])
    share = BatchShare(d.budget.cost, 3, 4, others_tokens=3.0, packed=True)
    tree = d.propose(_request(CONTEXT, share))
    ranked = d.ranked()
    assert ranked is not None and len(ranked) == tree.size - 1 >= 3
    assert ranked == sorted(ranked, reverse=True) and all(0 < p <= 1 for p in ranked)
    small = d.shrink(2)
    assert small.size == 3 and small.parents[0] == -1 and all(small.parents[1:] < torch.arange(1, 3))
    # the two best nodes: the copy's next tokens (8, then 9), the second under the first
    assert small.tokens.tolist() == [7, 8, 9] and small.parents.tolist() == [-1, 0, 1]
    cal = d.sources[0].calibration
    before = float(cal.trials.sum())
    d.observe([7, 8, 9], torch.zeros(3, 4), 10)
    assert float(cal.trials.sum()) - before == 2, "the round learns from the two verified nodes only"


def test_a_row_not_packed_sizes_its_own_tree_and_does_not_rank():
    for packed, kw in ((False, {}), (True, {"batch_pack": False})):
        d = _drafter(**kw)
        d.begin(torch.tensor(CONTEXT[:-1]), torch.zeros(len(CONTEXT) - 1, 4), CONTEXT[-1])
        d.propose(_request(CONTEXT, BatchShare(d.budget.cost, 3, 4, others_tokens=3.0, packed=packed)))
        assert d.ranked() is None
        with pytest.raises(RuntimeError):
            d.shrink(1)


def test_shrinking_to_nothing_leaves_the_root_and_learns_nothing():
    d = _drafter()
    d.begin(torch.tensor(CONTEXT[:-1]), torch.zeros(len(CONTEXT) - 1, 4), CONTEXT[-1])
    d.propose(_request(CONTEXT, BatchShare(d.budget.cost, 3, 4, others_tokens=3.0, packed=True)))
    tree = d.shrink(0)
    assert tree.size == 1 and int(tree.tokens[0]) == CONTEXT[-1]
    cal = d.sources[0].calibration
    before = float(cal.trials.sum())
    d.observe([7], torch.zeros(1, 4), 8)
    assert float(cal.trials.sum()) == before
