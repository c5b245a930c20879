"""The hybrid drafter: suffix index, trie merge, calibration, gates, and losslessness of mixed-source trees.

The distribution tests decode 5 tokens through trees of depth >= 3 whose siblings come from different
sources (context n-grams, a random EAGLE head, a draft LM), and compare with the target's exact
distribution computed here by enumerating every prefix, with a sampling warp written independently of
``drafttree.accept``. A deliberately broken acceptance rule must fail the same check.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from drafttree.accept import Sampling
from drafttree.drafters.hybrid import Gate, HybridDrafter, MergedTree
from drafttree.sources.base import Calibration, Proposal, RoundContext
from drafttree.sources.ngram import SuffixIndex
from drafttree.tree import Candidates
from tests.conftest import chi2_pvalue, reference_warp, tiny_causal_lm

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


class ConstantSource:
    """A test source: always proposes the same chain, costs ``cost`` forwards a level."""

    name = "const"

    def __init__(self, chain, cost=0.0, prior=0.9):
        self.chain, self.cost = chain, cost
        self.calibration = Calibration(torch.full((1,), prior))

    def begin(self, *a):
        pass

    def observe(self, *a):
        pass

    def propose(self, rc, index):
        cells = torch.zeros(len(self.chain), dtype=torch.long)
        cond = self.calibration.logp(cells)
        score = torch.cumsum(cond, 0)
        par = torch.arange(len(self.chain)) - 1
        return Proposal(index, Candidates(torch.tensor(self.chain), par, cond, score, cond.clone(), 0), cells)


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


def exact_distribution(model, prompt: list[int], s: Sampling, vocab: int, length: int) -> np.ndarray:
    """P(first ``length`` sampled tokens) for every sequence, by enumerating prefixes: [vocab] * length."""
    probs = np.ones(1)
    prefixes = [()]
    with torch.no_grad():
        for _ in range(length):
            seqs = torch.tensor([prompt + list(p) for p in prefixes])
            nxt = reference_warp(model(seqs).logits[:, -1].double().numpy(), s)  # [len(prefixes), vocab]
            probs = (probs[:, None] * nxt).reshape(-1)
            prefixes = [p + (a,) for p in prefixes for a in range(vocab)]
    return probs.reshape([vocab] * length)


VOCAB = 12
PROMPT = [3, 5, 7, 2, 3, 5, 7, 2, 3, 5]  # repetitive: the n-gram source always has a branch


def hybrid_drafter(target, draft_vocab: int | None = None):
    """n-grams + a random EAGLE head (+ an unrelated draft LM), fixed-size trees, gates off."""
    from drafttree.drafters import make_drafter
    from drafttree.heads.model import EagleHead
    from drafttree.models import LoadedModel

    torch.manual_seed(5)
    head = EagleHead(target)
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(3.0)
    draft = None
    if draft_vocab is not None:
        draft = LoadedModel(tiny_causal_lm("llama", vocab=draft_vocab, hidden=32, seed=7), None, "tiny-draft", "")
    tl = LoadedModel(target, None, "tiny", "")
    # with a draft LM it also drafts on after the n-grams' likeliest branch (`extend`): more mixed trees
    return make_drafter("hybrid", tl, draft, head, top_k=3, depth=4, total_tokens=12, gate=False, num_tokens=4,
                        extend=draft is not None)


def sample_sequences(target, drafter, s: Sampling, n: int, length: int, seed: int = 123):
    from drafttree.decode import DecodeStats, decode
    from drafttree.target import TargetModel

    tm = TargetModel(target)
    g = torch.Generator().manual_seed(seed)
    seqs, deep, mixed, multi = [], 0, 0, 0
    for _ in range(n):
        out: list[int] = []
        stats = DecodeStats()
        for new in decode(tm, drafter, torch.tensor(PROMPT), s, max_new_tokens=length, generator=g, stats=stats,
                          record_rounds=True):
            out.extend(new)
        seqs.append(out[:length])
        deep += any(r.get("depth", 0) >= 3 for r in stats.rounds)
        mixed += any(len(set(r.get("sources", []))) >= 2 for r in stats.rounds)
        multi += any(a >= 3 for a in stats.accept_lengths[1:])  # two drafts and the next token in one forward
    return np.array(seqs), deep / n, mixed / n, multi / n


def pvalues(seqs: np.ndarray, exact: np.ndarray) -> list[float]:
    v = VOCAB
    out = []
    for a, b in [(0, 1), (2, 3), (3, 4)]:
        joint = exact.sum(axis=tuple(i for i in range(exact.ndim) if i not in (a, b))).reshape(-1)
        counts = np.bincount(seqs[:, a] * v + seqs[:, b], minlength=v * v)
        out.append(chi2_pvalue(counts, joint))
    return out


SETTINGS = [Sampling(1.0), Sampling(0.8, top_p=0.9, top_k=6)]


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}")
def test_deep_mixed_trees_preserve_the_distribution(s):
    target = tiny_causal_lm("llama", vocab=VOCAB, hidden=32, seed=0)
    exact = exact_distribution(target, PROMPT, s, VOCAB, 5)
    seqs, deep, mixed, multi = sample_sequences(target, hybrid_drafter(target), s, n=800, length=5)
    assert deep > 0.5 and mixed > 0.5, f"trees must be deep and mixed (deep {deep:.2f}, mixed {mixed:.2f})"
    assert multi > 0.03, f"some forwards must commit several drafts ({multi:.2f})"  # >= 24 of the 800 draws
    ps = pvalues(seqs, exact)
    assert min(ps) > 1e-3, f"distribution mismatch: p-values {ps}"


def test_deep_mixed_trees_broken_rule_is_caught(monkeypatch):
    import drafttree.accept as A
    import drafttree.decode as D

    monkeypatch.setattr(D, "accept", lambda tree, logits, s, noise, pos: A.accept_sampled(tree, logits, s, noise, pos,
                                                                                         _broken=True))
    target = tiny_causal_lm("llama", vocab=VOCAB, hidden=32, seed=0)
    s = Sampling(1.0)
    exact = exact_distribution(target, PROMPT, s, VOCAB, 5)
    # 2,000 draws (the broken rule reuses a round's noise in later rounds: the later pairs carry the evidence)
    seqs, *_ = sample_sequences(target, hybrid_drafter(target), s, n=2000, length=5)
    assert min(pvalues(seqs, exact)) < 1e-4, "the broken rule was not detected on mixed trees"


def test_reference_warp_agrees_with_the_library_on_its_own_terms():
    """Not a proof of either (both could share a misreading of top-p), but a cross-check of two codes."""
    from drafttree.accept import warp_probs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20, 30, generator=g) * 3
    for s in SETTINGS + [Sampling(1.3, top_k=5), Sampling(0.5, top_p=0.5)]:
        ours = reference_warp(logits.numpy(), s)
        np.testing.assert_allclose(warp_probs(logits, s).numpy(), ours, atol=1e-5)


def test_draft_lm_with_a_smaller_vocabulary_samples_correctly(draft_vocab=10):
    """A draft with fewer output rows than the target (Qwen2.5-0.5B vs 7B): the sampled chain at T > 0 used to
    crash, and the draft must also read context tokens it has no embedding for."""
    from drafttree.drafters.draft_model import DraftModelDrafter

    target = tiny_causal_lm("llama", vocab=VOCAB, hidden=32, seed=0)
    draft = tiny_causal_lm("llama", vocab=draft_vocab, hidden=32, seed=7)
    s = Sampling(1.0)
    exact = exact_distribution(target, PROMPT, s, VOCAB, 5)
    seqs, *_ = sample_sequences(target, DraftModelDrafter(draft, VOCAB, k=3), s, n=700, length=5)
    assert min(pvalues(seqs, exact)) > 1e-3
    seqs, _, mixed, _ = sample_sequences(target, hybrid_drafter(target, draft_vocab), s, n=150, length=5)
    assert seqs.max() < VOCAB and mixed > 0.5


def test_exact_distribution_enumerates_every_sequence():
    target = tiny_causal_lm("llama", vocab=VOCAB, hidden=32, seed=0)
    d = exact_distribution(target, PROMPT, Sampling(1.0), VOCAB, 3)
    assert d.shape == (VOCAB,) * 3 and d.sum() == pytest.approx(1.0)
    with torch.no_grad():  # one cell by hand
        a, b, c = 4, 9, 1
        p = 1.0
        for prefix, tok in [([], a), ([a], b), ([a, b], c)]:
            logits = target(torch.tensor([PROMPT + prefix])).logits[0, -1].double().numpy()
            p *= reference_warp(logits[None], Sampling(1.0))[0, tok]
    assert d[a, b, c] == pytest.approx(p, rel=1e-5)


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
    assert 0 < drafts(batch, accepted=False) < 15, "a row whose drafts never pay must stop drafting, but probe"
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
