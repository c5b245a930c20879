"""The hybrid drafter: suffix index, trie merge, calibration, gates. Mixed-source trees' distributions:
test_hybrid_distribution.py; drafting that pays for itself (batch bars, draft gates): test_hybrid_gates.py."""

from __future__ import annotations

import random

import pytest
import torch

from drafttree.accept import Sampling
from drafttree.drafters.hybrid import Gate, HybridDrafter, MergedTree
from drafttree.sources.base import Calibration, Proposal
from drafttree.sources.ngram import SuffixIndex
from drafttree.tree import Candidates
from tests.constant_source import ConstantSource

# ------------------------------------------------------------------------------------------ building blocks


def brute_matches(tokens: list[int], max_ngram: int) -> dict[int, int]:
    """Every earlier position following an occurrence of the suffix, with its backward match length."""
    end = len(tokens)
    out = {}
    for p in range(1, end):
        m = 0
        while m < min(32, p) and tokens[p - m - 1] == tokens[end - m - 1]:
            m += 1
        if m >= 1:
            out[p] = m
    return out


def test_suffix_index_is_incremental_and_exact():
    rng = random.Random(0)
    idx = SuffixIndex(max_ngram=4)
    tokens: list[int] = []
    for _ in range(60):
        tokens += [rng.randrange(5) for _ in range(rng.randrange(1, 4))]
        idx.sync(tokens)
        got = dict(idx.matches(max_candidates=10_000))
        want = brute_matches(tokens, 4)
        assert got == want
    # the longest n-gram's occurrences come first, most recent first among equals
    order = idx.matches(max_candidates=10_000)
    lens = [min(m, 4) for _, m in order]
    assert lens == sorted(lens, reverse=True)


def test_suffix_index_resets_on_a_new_context():
    idx = SuffixIndex(3)
    idx.sync([1, 2, 3, 1, 2])
    assert idx.matches(5) == [(2, 2)]
    idx.sync([7, 8, 7])
    assert idx.tokens == [7, 8, 7] and idx.matches(5) == [(1, 1)]


def _cands(tokens, parents, logps):
    cond = torch.tensor(logps, dtype=torch.float32)
    score = cond.clone()
    for i, q in enumerate(parents):
        if q >= 0:
            score[i] += score[q]
    return Candidates(torch.tensor(tokens), torch.tensor(parents), cond, score, cond.clone())


def test_merge_shares_prefixes_keeps_best_score_and_stays_connected():
    a = Proposal(0, _cands([5, 6, 7], [-1, 0, 1], [-0.1, -0.1, -0.1]), torch.tensor([0, 1, 2]))
    b = Proposal(1, _cands([5, 9, 4], [-1, 0, -1], [-0.5, -0.01, -0.2]), torch.tensor([3, 4, 5]))
    m = MergedTree(root=1)
    m.add(a, limit=10)
    m.add(b, limit=10)
    assert m.tokens == [1, 5, 6, 7, 9, 4]
    assert m.parents == [-1, 0, 1, 2, 1, 0]
    assert m.scores[1] == pytest.approx(-0.1)  # max of both sources' estimates
    assert m.owners[1] == [(0, 0), (1, 3)]
    for n in range(1, 7):
        keep = m.best(n)
        assert len(keep) == n and keep == sorted(keep)
        assert all(m.parents[i] in keep for i in keep[1:]), "the kept nodes must form a tree"


def test_merge_takes_a_proposals_best_nodes_ties_to_the_earlier():
    """``limit`` below a proposal's size: its ``limit`` best-scored nodes join (equal scores: the earlier node), in
    creation order, so parents come before children."""
    # scores: 5 -0.2, 6 -0.5, 7 -0.3, 8 -0.5 (a tie with 6), 9 -0.6 (below 6)
    a = Proposal(0, _cands([5, 6, 7, 8, 9], [-1, 0, -1, 2, 1], [-0.2, -0.3, -0.3, -0.2, -0.1]),
                 torch.tensor([0, 1, 2, 3, 4]))
    for limit, kept in ((1, [5]), (2, [5, 7]), (3, [5, 6, 7]), (4, [5, 6, 7, 8]), (5, [5, 6, 7, 8, 9])):
        m = MergedTree(root=1)
        m.add(a, limit=limit)
        assert m.tokens == [1, *kept], limit
        assert all(p < i for i, p in enumerate(m.parents) if i), "parents before children"


def test_agreed_nodes_are_rated_by_what_agreement_was_worth():
    """With no evidence an agreed node reads as its best single estimate; once agreement has been seen to be
    accepted it reads higher, and its subtree with it; nodes one source alone proposed keep their estimate."""
    from drafttree.drafters.merged import Agreement

    a = Proposal(0, _cands([5, 6], [-1, 0], [-0.7, -0.2]), torch.tensor([0, 1]))
    b = Proposal(1, _cands([5, 9], [-1, -1], [-0.9, -0.3]), torch.tensor([3, 4]))
    agreement = Agreement(sources=2)
    m = MergedTree(root=1)
    m.add(a, limit=10)
    m.add(b, limit=10)
    m.rescore(agreement)
    assert m.scores[1] == pytest.approx(-0.7, abs=1e-6) and m.scores[2] == pytest.approx(-0.9, abs=1e-6)
    cell = m.agreed[1]
    assert cell >= 0 and m.agreed[2] == -1 and m.agreed[3] == -1  # only token 5 was proposed by both
    for _ in range(20):
        agreement.update(cell, True)
    m.rescore(agreement)
    assert m.scores[1] > -0.1, "agreement that was always accepted must read near 1"
    assert m.scores[2] == pytest.approx(m.scores[1] - 0.2, abs=1e-6), "the subtree follows its parent"
    assert m.scores[3] == pytest.approx(-0.3, abs=1e-6)
    for _ in range(200):
        agreement.update(cell, False)
    m.rescore(agreement)
    assert m.scores[1] < -2.0, "agreement that was never accepted must read low"


@pytest.mark.parametrize("agree", [True, False])
def test_sources_learn_from_the_nodes_they_alone_proposed(agree):
    """A node two sources proposed teaches the agreement table, not the sources' own cells (agree=False: the old
    rule, every source learns from every node it proposed)."""
    from drafttree.drafters.base import DraftRequest

    first, second = ConstantSource([3, 4], prior=0.5), ConstantSource([3, 8], prior=0.5)
    hd = HybridDrafter([first, second], total_tokens=8, gate=False, agree=agree)
    hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
    hd.propose(DraftRequest([1, 2], 2, 8, Sampling(), None))
    hd.observe([2, 3, 4], torch.zeros(3, 4), 7)  # 3 (both) and then 4 (the first alone) accepted
    t1, t2 = float(hd.calibrations["greedy"][0].trials[0]), float(hd.calibrations["greedy"][1].trials[0])
    if agree:
        assert (t1, t2) == (1.0, 1.0), "each source: its own second node only"
        assert sum(hd.agreement.trials) == 1.0 and sum(hd.agreement.hits) == 1.0
    else:
        assert (t1, t2) == (2.0, 2.0) and sum(hd.agreement.trials) == 0.0


def test_calibration_learns_and_gate_closes_for_a_useless_source():
    cal = Calibration(torch.full((3,), 0.5))
    cal.update([0] * 40, [True] * 40)
    cal.update([1] * 40, [False] * 40)
    r = cal.rate(torch.tensor([0, 1, 2]))
    assert r[0] > 0.9 and r[1] < 0.1 and r[2] == pytest.approx(0.5)

    gate = Gate(probe=4, max_probe=16)
    runs = 0
    for _ in range(200):
        if gate.allow(0):
            runs += 1
            gate.record(0, gain=0.0, cost=0.3, base_tokens=2.0)
    assert runs < 30, "a source that never adds accepted tokens must be probed rarely"
    gate.record(0, gain=3.0, cost=0.3, base_tokens=2.0)
    assert gate.allow(0)


def test_one_unlucky_round_does_not_close_a_gate_but_repeated_failures_do():
    gate = Gate(probe=8)
    gate.record(0, gain=0.0, cost=1.0, base_tokens=1.0)  # a good source's first round happened to miss
    assert gate.allow(0)
    gate.record(0, gain=0.0, cost=1.0, base_tokens=1.0)
    gate.record(0, gain=0.0, cost=1.0, base_tokens=1.0)
    assert not gate.allow(0)
    assert Gate(optimism=0.5).allow(0)  # nothing recorded yet: always open


def test_a_gate_weighs_cost_against_the_tokens_of_its_own_situation():
    """Where the cheaper sources give 6 tokens a round, 2 marginal tokens for 1 forward of drafting do not
    pay; where they give nothing (the root alone), the same source pays and must stay open."""
    gate = Gate(probe=100)
    for _ in range(20):
        gate.record(2, gain=2.0, cost=1.0, base_tokens=6.0)
        gate.record(0, gain=2.0, cost=1.0, base_tokens=1.0)
    assert gate.allow(0) and not gate.allow(2)


def test_a_wrong_source_shrinks_the_tree_to_the_root():
    """Calibration learns that a confident source is always wrong; the budget then verifies the root alone."""
    from drafttree.budget import CostModel, TreeBudget
    from drafttree.drafters.base import DraftRequest

    budget = TreeBudget(CostModel([1, 2, 4, 8], [1.0, 1.2, 1.5, 2.0]), max_total=8, min_total=1)
    hd = HybridDrafter([ConstantSource([3, 4, 5])], budget=budget)
    hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
    sizes = []
    for _ in range(30):
        req = DraftRequest([1, 2, 2], 2, 8, Sampling(), None)
        tree = hd.propose(req)
        sizes.append(tree.size)
        hd.observe([2], torch.zeros(1, 4), 7)  # the target never accepts the source's token
    assert sizes[0] > 1 and sizes[-1] == 1


def test_trees_shrink_over_a_long_context():
    """Each verified token attends to the whole context, so the same proposals make a smaller tree over a long
    context: the curve at a context is the measured one plus per_key x tokens x (context - measured context)."""
    from drafttree.budget import CostModel, TreeBudget
    from drafttree.drafters.base import DraftRequest

    curve = CostModel([1, 2, 4, 8], [1.0, 1.1, 1.3, 1.7], context=256, per_key=2e-4)
    assert curve.at(256).seconds == curve.seconds
    assert abs(curve.at(2048).verify(8) - (1.7 + 2e-4 * 8 * (2048 - 256))) < 1e-9
    assert curve.at(100).verify(4) < curve.verify(4) and curve.at(300) is curve.at(290)  # memoised per 64 tokens
    assert CostModel([1, 2], [1.0, 1.1]).at(5000).verify(2) == 1.1  # no slope measured: the curve as it is
    sizes = {}
    for length in (200, 4000):
        hd = HybridDrafter([ConstantSource([3, 4, 5, 6, 7], prior=0.6)], budget=TreeBudget(curve, max_total=8))
        hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
        sizes[length] = hd.propose(DraftRequest([1, 2] * (length // 2), 2, 8, Sampling(), None)).size
    assert sizes[200] > sizes[4000] >= 1, sizes


def test_fitted_priors_are_read_once_per_file_version(tmp_path):
    """Every batched request makes a drafter: the priors file is parsed once, and read again when it changes."""
    import json
    import os

    from drafttree.sources.priors import PRIORS_FILE, load_priors

    path = tmp_path / PRIORS_FILE
    path.write_text(json.dumps({"sources": {"const": {"hits": [1.0], "trials": [2.0]}}}))
    first = load_priors(tmp_path)
    assert load_priors(tmp_path) is first and float(first["greedy"]["const"][0][0]) == 1.0
    path.write_text(json.dumps({"sources": {"const": {"hits": [7.0, 1.0], "trials": [9.0, 1.0]}}}))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))  # a new version (coarse clocks)
    again = load_priors(tmp_path)
    assert again is not first and again["greedy"]["const"][0].tolist() == [7.0, 1.0]
    assert load_priors(None) == {} and load_priors(tmp_path / "none") == {}


def test_greedy_and_sampled_generations_learn_separate_calibrations():
    """What the target accepts at T=0 says little about T=1: each mode has its own cells and fitted prior."""
    from drafttree.budget import CostModel, TreeBudget
    from drafttree.drafters.base import DraftRequest
    from drafttree.sources.priors import apply_priors

    budget = TreeBudget(CostModel([1, 2, 4, 8], [1.0, 1.2, 1.5, 2.0]), max_total=8, min_total=1)
    src = ConstantSource([3, 4, 5], prior=0.5)
    hd = HybridDrafter([src], budget=budget)
    fitted = {"greedy": {"const": (torch.tensor([90.0]), torch.tensor([100.0]))},
              "sampled": {"const": (torch.tensor([40.0]), torch.tensor([100.0]))}}
    apply_priors(hd.calibrations, ["const"], fitted)
    greedy, sampled = hd.calibrations["greedy"][0], hd.calibrations["sampled"][0]
    assert float(greedy.prior[0]) > 0.8 and float(sampled.prior[0]) < 0.5

    def run(sampling, rounds=5):
        hd.begin(torch.tensor([1, 2]), torch.zeros(2, 4), 2)
        for _ in range(rounds):
            hd.propose(DraftRequest([1, 2, 2], 2, 8, sampling, None))
            hd.observe([2, 3, 4], torch.zeros(3, 4), 7)  # the target accepts 3 and 4

    run(Sampling())
    assert src.calibration is greedy and float(greedy.trials.sum()) > 0
    assert float(sampled.trials.sum()) == 0, "greedy rounds must not move the sampled cells"
    run(Sampling(temperature=1.0))
    assert src.calibration is sampled and float(sampled.trials.sum()) > 0


# --------------------------------------------------------------- T > 0: deep mixed-source trees are lossless


def test_calibration_rates_follow_every_change_of_counts_and_prior():
    """The memoised rate tables are rebuilt after updates, decay, reset, an in-place change of the prior or the counts
    and a new prior: rate / logp / rate_of always equal (hits + s * prior) / (trials + s), floored."""
    cal = Calibration(torch.tensor([0.2, 0.5, 0.9, 0.6]), strength=4.0)
    cells = torch.tensor([0, 1, 2, 3, 1])

    def check():
        want = ((cal.hits + cal.strength * cal.prior) / (cal.trials + cal.strength)).clamp(cal.floor, 1.0)
        torch.testing.assert_close(cal.rate(cells), want[cells].float())
        torch.testing.assert_close(cal.logp(cells), want[cells].float().log())
        assert [cal.rate_of(c) for c in range(4)] == pytest.approx(want.tolist(), rel=1e-12)

    check()
    cal.update([0, 0, 2], [True, True, False])
    check()
    cal.decay(0.5)
    check()
    cal.prior.fill_(0.97)
    check()
    cal.hits.zero_()
    check()
    cal.prior, cal.strength = torch.tensor([0.1, 0.1, 0.1, 0.1], dtype=torch.float64), 8.0
    check()
    cal.reset()
    check()
    with torch.inference_mode():  # counts made under inference mode keep no version: still right
        cal.hits = torch.zeros(4, dtype=torch.float64)
        cal.update([1], [True])
    check()
