"""The hybrid drafter: suffix index, trie merge, calibration, gates, and losslessness of mixed-source trees.

The distribution tests decode 5 tokens through trees of depth >= 3 whose siblings come from different
sources (context n-grams, a random EAGLE head, a draft LM), and compare with the target's exact
distribution computed here by enumerating every prefix, with a sampling warp written independently of
``drafttree.accept``. A deliberately broken acceptance rule must fail the same check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drafttree.accept import Sampling
from tests.conftest import chi2_pvalue, reference_warp, tiny_causal_lm

# ------------------------------------------------------------------------------------------ building blocks


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
