"""Free sources at T > 0: each calibration cell split by the bin of its candidate's Gumbel noise (sources/base.py).

The target's token at a position is argmax(log r + g) with g that position's noise, known before drafting; a candidate
x's chance of being that token given its own noise g_x is exp(-(1 - p) / p * e^-g_x). The bin rates here are checked
against a simulation of the argmax itself, not against the formula."""

from __future__ import annotations

import bisect
import math

import torch

from drafttree.accept import Sampling
from drafttree.noise import Noise
from drafttree.sources.base import (
    NOISE_BINS,
    NOISE_EDGES,
    Calibration,
    NoiseCalibration,
    RoundContext,
    _gumbel_bin_means,
    noise_prior,
)
from drafttree.sources.corpus import CorpusIndex, CorpusSource
from drafttree.sources.ngram import NgramSource


def _bin_weights() -> torch.Tensor:
    cdf = [math.exp(-math.exp(-e)) for e in NOISE_EDGES]
    return torch.tensor([cdf[0]] + [b - a for a, b in zip(cdf, cdf[1:])] + [1 - cdf[-1]], dtype=torch.float64)


def test_bin_rates_match_a_simulated_gumbel_argmax():
    """For tokens of a fixed distribution: how often a token is the noisy argmax, per bin of its own noise, in 200,000
    simulated draws, equals the computed bin rate (to sampling error); the rates rise with the noise."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(24, generator=g, dtype=torch.float64) * 1.5
    r = logits.softmax(-1)
    u = torch.rand(200_000, 24, generator=g, dtype=torch.float64).clamp_(min=1e-300)
    noise = -torch.log(-torch.log(u))
    winner = (r.log() + noise).argmax(-1)
    edges = torch.tensor(NOISE_EDGES, dtype=torch.float64)
    for x in (int(r.argmax()), int(r.argsort()[len(r) // 2]), int(r.argmin())):
        want = _gumbel_bin_means(r[x : x + 1])[0]
        bins = torch.bucketize(noise[:, x].contiguous(), edges, right=True)
        for b in range(NOISE_BINS):
            sel = bins == b
            got = float((winner[sel] == x).double().mean())
            assert abs(got - float(want[b])) < 0.015, (x, b, got, float(want[b]))
        assert all(float(want[b]) <= float(want[b + 1]) for b in range(NOISE_BINS - 1))


def test_the_split_prior_keeps_each_cells_mean_and_favours_high_noise():
    base = torch.tensor([0.03, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98], dtype=torch.float64)
    split = noise_prior(base).reshape(-1, NOISE_BINS)
    torch.testing.assert_close(split @ _bin_weights(), base, atol=0.01, rtol=0.0)
    assert bool((split[:, 1:] >= split[:, :-1]).all())
    assert float(split[3, -1]) > 0.8 and float(split[3, 0]) < 0.3  # p = 0.5: the noise says most of it


def _round(context: list[int], noise: Noise | None, temperature: float) -> RoundContext:
    return RoundContext(context, context[-1], 8, Sampling(temperature=temperature), [], 0.0, noise)


def test_ngram_cells_take_the_noise_bin_of_each_candidates_position():
    """At T > 0 with its sampled calibration, every n-gram node's cell is its plain cell x bins + the bin of its
    token's noise at root_pos + depth; the plain calibration keeps the plain cells."""
    context = [5, 6, 7, 8, 9, 5, 6, 7, 3, 4, 5, 6, 7]
    noise = Noise(seed=11, vocab=32)
    plain = NgramSource()
    prop = plain.propose(_round(context, noise, 1.0), 0)
    assert prop is not None and int(prop.cells.max()) < plain.calibration.prior.numel()
    split = NgramSource()
    split.calibration = split.sampled_calibration()
    assert split.calibration.prior.numel() == plain.calibration.prior.numel() * NOISE_BINS
    got = split.propose(_round(context, noise, 1.0), 0)
    assert got.cands.tokens.tolist() == prop.cands.tokens.tolist()
    depths: list[int] = []
    for p in prop.cands.parents.tolist():
        depths.append(1 if p < 0 else depths[p] + 1)
    root_pos = len(context) - 1
    want = [c * NOISE_BINS + bisect.bisect_right(NOISE_EDGES, float(noise.at(root_pos + d)[t]))
            for c, t, d in zip(prop.cells.tolist(), prop.cands.tokens.tolist(), depths)]
    assert got.cells.tolist() == want
    assert len({c % NOISE_BINS for c in want}) > 1, "the test context should see several bins"
    # each node's estimate is its split cell's rate
    torch.testing.assert_close(got.cands.cond_logp, split.calibration.logp(got.cells))
    # another seed, other bins: other estimates for the same candidates
    other = split.propose(_round(context, Noise(seed=12, vocab=32), 1.0), 0)
    assert other.cands.tokens.tolist() == got.cands.tokens.tolist() and other.cells.tolist() != got.cells.tolist()


def test_corpus_cells_are_split_too_and_greedy_rounds_read_the_median_bin():
    tokens = torch.tensor([1, 2, 3, 4, 5, -1, 1, 2, 3, 6, 7, -1, 2, 3, 4, 5, 9]).numpy()
    src = CorpusSource(CorpusIndex(tokens))
    noise = Noise(seed=3, vocab=16)
    plain = src.propose(_round([8, 1, 2, 3], noise, 1.0), 0)
    src.calibration = src.sampled_calibration()
    got = src.propose(_round([8, 1, 2, 3], noise, 1.0), 0)
    assert got.cands.tokens.tolist() == plain.cands.tokens.tolist()
    assert [c // NOISE_BINS for c in got.cells.tolist()] == plain.cells.tolist()
    greedy = src.propose(_round([8, 1, 2, 3], noise, 0.0), 0)
    median = bisect.bisect_right(NOISE_EDGES, -math.log(math.log(2.0)))
    assert greedy.cells.tolist() == [c * NOISE_BINS + median for c in plain.cells.tolist()]


def test_a_fitted_prior_of_the_plain_layout_is_split_by_noise_bin():
    from drafttree.sources.priors import apply_priors

    cal = NgramSource().sampled_calibration()
    base_cells = cal.base_cells
    hits, trials = torch.full((base_cells,), 30.0), torch.full((base_cells,), 100.0)
    apply_priors({"sampled": [cal]}, ["ngram"], {"sampled": {"ngram": (hits.double(), trials.double())}}, 8.0)
    blended = (hits.double() + 8.0 * cal.base_default) / (trials.double() + 8.0)
    torch.testing.assert_close(cal.prior, noise_prior(blended))
    assert cal.strength == 8.0
    fresh = cal.fresh()  # a fresh one starts from the built-in default again, still split
    assert isinstance(fresh, NoiseCalibration) and torch.equal(fresh.prior, noise_prior(cal.base_default))
    assert not isinstance(Calibration(torch.tensor([0.5])).fresh(), NoiseCalibration)


def test_hybrid_splits_free_sources_sampled_cells_only_with_the_option():
    from drafttree.budget import CostModel, TreeBudget
    from drafttree.drafters.hybrid import HybridDrafter

    budget = TreeBudget(CostModel([1, 2, 4, 8], [1.0, 1.2, 1.5, 2.0]), max_total=8, min_total=1)
    hd = HybridDrafter([NgramSource()], budget=budget, noise_cells=True)
    assert not isinstance(hd.calibrations["greedy"][0], NoiseCalibration)
    assert isinstance(hd.calibrations["sampled"][0], NoiseCalibration)
    plain = HybridDrafter([NgramSource()], budget=budget)  # the default: one cell per plain cell at T > 0 too
    assert not isinstance(plain.calibrations["sampled"][0], NoiseCalibration)


def test_auto_with_noise_cells_gives_plain_sampling_text(default_fp32):
    """Drafting reads the noise, the output never depends on it: seeded T=1 text on the real default model (float32,
    shipped head) equals plain decoding's, and the split cells were put to the test on the way."""
    from drafttree.api import SpeculativeModel
    from drafttree.heads import load_head_for

    lm = SpeculativeModel(default_fp32, head=load_head_for(default_fp32))
    prompt = "Write two sentences about rivers, then repeat them word for word."
    options = {"noise_cells": True}
    for seed in (4, 5):
        plain = lm.generate(prompt, max_new_tokens=40, temperature=1.0, seed=seed, method="ar").tokens
        got = lm.generate(prompt, max_new_tokens=40, temperature=1.0, seed=seed, method="auto",
                          method_options=options)
        assert got.tokens == plain
    split = [c for c in lm.drafter("auto", options).calibrations["sampled"] if isinstance(c, NoiseCalibration)]
    assert split and sum(float(c.trials.sum()) for c in split) > 0
