"""Speculative sampling is lossless: distributions of sampled tokens equal the target's.

Part 1 drives the acceptance rule directly with synthetic bigram "models" (fast, many draws, many tree
shapes). Part 2 runs the whole decode loop on tiny random transformers models with a draft that often
disagrees. A deliberately broken rule must fail the same check.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from drafttree.accept import Sampling, accept_sampling, warp_probs
from drafttree.tree import DraftTree
from tests.conftest import chi2_pvalue, tiny_causal_lm

V = 6


def bigram(seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, V, generator=g) * scale  # logits[prev, next]


def exact_two_tokens(P: torch.Tensor, root: int, s: Sampling) -> np.ndarray:
    p1 = warp_probs(P[root], s)
    out = np.zeros((V, V))
    for a in range(V):
        out[a] = (p1[a] * warp_probs(P[a], s)).numpy()
    return out.reshape(-1)


def run_accept(P, Q, root, s, shape, n, seed, broken=False):
    """Draw ``n`` two-token continuations through accept_sampling; returns counts over V*V cells."""
    g = torch.Generator().manual_seed(seed)
    counts = np.zeros(V * V)
    for _ in range(n):
        if shape == "sampled-chain":
            toks, qs, prev = [], [], root
            for _ in range(3):
                q = warp_probs(Q[prev], s)
                prev = int(torch.multinomial(q, 1, generator=g))
                toks.append(prev)
                qs.append(q)
            probs = torch.zeros(4, V)
            probs[1:] = torch.stack(qs)
            tree = DraftTree.chain(root, toks, draft_probs=probs)
        else:
            # deterministic top-k tree from Q: root's top-3 children, top-2 grandchildren under the first two
            kids = Q[root].topk(3).indices.tolist()
            tokens, parents = [root], [-1]
            for k in kids:
                tokens.append(k)
                parents.append(0)
            for j, k in enumerate(kids[:2]):
                for gk in Q[k].topk(2).indices.tolist():
                    tokens.append(gk)
                    parents.append(1 + j)
            if shape == "point-chain":
                tokens, parents = tokens[:2] + [tokens[4]], [-1, 0, 1]
            tree = DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents))
        logits = P[tree.tokens]  # target logits at every node depend on the node's token (bigram)
        path, nxt = accept_sampling(tree, logits, s, g, _broken=broken)
        seq = tree.tokens[path[1:]].tolist() + [nxt]
        while len(seq) < 2:
            seq.append(int(torch.multinomial(warp_probs(P[seq[-1]], s), 1, generator=g)))
        counts[seq[0] * V + seq[1]] += 1
    return counts


SETTINGS = [Sampling(1.0), Sampling(0.7), Sampling(1.5, top_p=0.8), Sampling(1.0, top_k=3)]


@pytest.mark.parametrize("shape", ["sampled-chain", "point-tree", "point-chain"])
@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}")
def test_acceptance_rule_preserves_distribution(shape, s):
    P, Q = bigram(0), bigram(1)  # draft disagrees with the target
    counts = run_accept(P, Q, 2, s, shape, n=6000, seed=11)
    p = chi2_pvalue(counts, exact_two_tokens(P, 2, s))
    assert p > 1e-3, f"distribution mismatch, chi-square p={p:.2e}"


@pytest.mark.parametrize("shape", ["sampled-chain", "point-tree"])
def test_broken_rule_is_caught(shape):
    """Skipping the residual renormalisation looks plausible and is wrong; the same check must fail."""
    P, Q = bigram(0), bigram(1)
    s = Sampling(1.0)
    counts = run_accept(P, Q, 2, s, shape, n=6000, seed=11, broken=True)
    p = chi2_pvalue(counts, exact_two_tokens(P, 2, s))
    assert p < 1e-6, f"the broken rule was not detected (p={p:.2e})"


def test_near_perfect_draft_accepts_a_lot():
    P = bigram(0)
    s = Sampling(1.0)
    g = torch.Generator().manual_seed(0)
    accepted = 0
    for _ in range(300):
        q = warp_probs(P[2], s)
        t = int(torch.multinomial(q, 1, generator=g))
        probs = torch.zeros(2, V)
        probs[1] = q
        path, _ = accept_sampling(DraftTree.chain(2, [t], draft_probs=probs), P[torch.tensor([2, t])], s, g)
        accepted += len(path) - 1
    assert accepted == 300  # q == p: min(1, p/q) = 1, always accepted


# ------------------------------------------------------------------- end to end on tiny transformers models


def _exact_prefix_dist(model, prompt: list[int], s: Sampling, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact joint distribution of the first two sampled tokens and the marginal of the third."""
    with torch.no_grad():
        p1 = warp_probs(model(torch.tensor([prompt])).logits[0, -1], s)
        seqs = torch.tensor([prompt + [a] for a in range(vocab)])
        p2 = warp_probs(model(seqs).logits[:, -1], s)  # [a, b]
        joint = p1[:, None] * p2
        seqs3 = torch.tensor([prompt + [a, b] for a, b in itertools.product(range(vocab), range(vocab))])
        p3 = warp_probs(model(seqs3).logits[:, -1], s)  # [(a,b), c]
        third = (joint.reshape(-1, 1) * p3).sum(0)
    return joint.reshape(-1).numpy(), third.numpy()


@pytest.mark.parametrize("method,opts,s", [
    ("draft", {"k": 3}, Sampling(1.0)),
    ("draft", {"k": 3}, Sampling(0.8, top_p=0.9)),
    ("draft", {"k": 3, "tree": True, "top_k": 3, "total_tokens": 8}, Sampling(1.2, top_k=8)),
])
def test_decode_loop_distribution_tiny_models(method, opts, s):
    p12, p3, acc = _decode_loop_pvalues(opts, s)
    assert 0.05 < acc < 0.95, f"the draft should be accepted sometimes, not always (rate {acc:.2f})"
    assert p12 > 1e-3 and p3 > 1e-3, f"p(first two)={p12:.2e} p(third)={p3:.2e}"


def test_decode_loop_broken_rule_is_caught(monkeypatch):
    import drafttree.accept as A
    import drafttree.decode as D

    def broken(tree, logits, sampling, generator):
        return A.accept_sampling(tree, logits, sampling, generator, _broken=True)

    monkeypatch.setattr(D, "accept", broken)
    p12, p3, _ = _decode_loop_pvalues({"k": 3}, Sampling(1.0))
    assert min(p12, p3) < 1e-4, f"broken rule not detected end to end (p={p12:.2e}, {p3:.2e})"


def _decode_loop_pvalues(opts, s, n: int = 2500, drafter=None, target=None):
    from drafttree.decode import DecodeStats, decode
    from drafttree.drafters.draft_model import DraftModelDrafter
    from drafttree.target import TargetModel

    vocab = 12
    if target is None:
        target = tiny_causal_lm("llama", vocab=vocab, hidden=32, seed=0)
    if drafter is None:
        draft = tiny_causal_lm("llama", vocab=vocab, hidden=32, seed=7)  # an unrelated draft: disagrees often
        drafter = DraftModelDrafter(draft, vocab, **opts)
    prompt = [3, 5, 7, 2]
    tm = TargetModel(target)
    g = torch.Generator().manual_seed(123)
    c12, c3 = np.zeros(vocab * vocab), np.zeros(vocab)
    drafted = accepted = 0
    for _ in range(n):
        out: list[int] = []
        stats = DecodeStats()
        for new in decode(tm, drafter, torch.tensor(prompt), s, max_new_tokens=3, generator=g, stats=stats):
            out.extend(new)
        drafted += sum(t - 1 for t in stats.tree_sizes)
        accepted += sum(a - 1 for a in stats.accept_lengths)
        c12[out[0] * vocab + out[1]] += 1
        c3[out[2]] += 1
    joint, third = _exact_prefix_dist(target, prompt, s, vocab)
    return chi2_pvalue(c12, joint), chi2_pvalue(c3, third), accepted / max(1, drafted)


@pytest.mark.parametrize("method,opts,s", [
    ("eagle2", {"depth": 3, "top_k": 3, "total_tokens": 8}, Sampling(1.0)),
    ("eagle2", {"depth": 2, "top_k": 5, "total_tokens": 10}, Sampling(0.7, top_p=0.9)),
    ("eagle1", {"depth": 3}, Sampling(1.3, top_k=6)),
    ("eagle-chain", {"depth": 3}, Sampling(1.0)),
])
def test_eagle_trees_preserve_the_distribution(method, opts, s):
    """EAGLE trees (deterministic top-k candidates, point-mass rule) and the sampled EAGLE chain."""
    from drafttree.drafters.eagle import make_eagle_drafter
    from drafttree.heads.model import EagleHead
    from drafttree.models import LoadedModel

    vocab = 12
    target = tiny_causal_lm("llama", vocab=vocab, hidden=32, seed=0)
    torch.manual_seed(5)
    head = EagleHead(target)
    with torch.no_grad():
        for p in head.parameters():
            p.mul_(3.0)  # a random head with confident (and mostly wrong) drafts
    drafter = make_eagle_drafter(method, LoadedModel(target, None, "tiny", ""), head, **opts)
    p12, p3, acc = _decode_loop_pvalues(None, s, drafter=drafter, target=target)
    assert 0.02 < acc < 0.98, f"drafts should be accepted sometimes (rate {acc:.2f})"
    assert p12 > 1e-3 and p3 > 1e-3, f"p(first two)={p12:.2e} p(third)={p3:.2e}"


def test_eagle_tree_broken_rule_is_caught(monkeypatch):
    import drafttree.accept as A
    import drafttree.decode as D
    from drafttree.drafters.eagle import make_eagle_drafter
    from drafttree.heads.model import EagleHead
    from drafttree.models import LoadedModel

    monkeypatch.setattr(D, "accept", lambda tree, logits, s, g: A.accept_sampling(tree, logits, s, g, _broken=True))
    target = tiny_causal_lm("llama", vocab=12, hidden=32, seed=0)
    torch.manual_seed(5)
    head = EagleHead(target)
    drafter = make_eagle_drafter("eagle2", LoadedModel(target, None, "tiny", ""), head, depth=3, top_k=3,
                                 total_tokens=8)
    p12, p3, _ = _decode_loop_pvalues(None, Sampling(1.0), drafter=drafter, target=target)
    assert min(p12, p3) < 1e-4, f"broken rule not detected on trees (p={p12:.2e}, {p3:.2e})"


# ------------------------------------------------------------------- batched decoding keeps every row's law


def _batch_pvalues(opts: dict, s: Sampling, n: int = 800):
    """Three rows per batch (two prompts, ragged lengths), decoded together n times: each row's first three
    tokens against the exact distribution of its own prompt."""
    from drafttree.batching import AlwaysDraft, BatchTarget, Sequence, decode_batch
    from drafttree.drafters.draft_model import DraftModelDrafter

    vocab = 12
    target = tiny_causal_lm("llama", vocab=vocab, hidden=32, seed=0)
    draft = tiny_causal_lm("llama", vocab=vocab, hidden=32, seed=7)
    prompts = [[3, 5, 7, 2], [1, 4, 4, 9, 6, 2, 8], [3, 5, 7, 2]]
    bt = BatchTarget(target)
    drafters = [DraftModelDrafter(draft, vocab, **opts) for _ in prompts]
    g = torch.Generator().manual_seed(321)
    c12 = {0: np.zeros(vocab * vocab), 1: np.zeros(vocab * vocab)}
    c3 = {0: np.zeros(vocab), 1: np.zeros(vocab)}
    deep = 0
    for _ in range(n):
        seqs = [Sequence(torch.tensor(p), d, s, 5, generator=g) for p, d in zip(prompts, drafters)]
        decode_batch(bt, seqs, policy=AlwaysDraft())  # every round drafts: the rule is what is tested
        for p_idx, seq in zip((0, 1, 0), seqs):
            t = seq.tokens
            c12[p_idx][t[0] * vocab + t[1]] += 1
            c3[p_idx][t[2]] += 1
            deep += max(seq.stats.tree_sizes, default=1) >= 4
    assert deep > n, "the batch should verify trees of several nodes"
    pvals = []
    for p_idx, prompt in enumerate(prompts[:2]):
        joint, third = _exact_prefix_dist(target, prompt, s, vocab)
        pvals += [chi2_pvalue(c12[p_idx], joint), chi2_pvalue(c3[p_idx], third)]
    return pvals


@pytest.mark.parametrize("opts,s", [
    ({"k": 3}, Sampling(1.0)),  # sampled chains: the q-ratio rule
    ({"k": 3, "tree": True, "top_k": 3, "total_tokens": 8}, Sampling(0.9, top_p=0.95)),  # top-k trees
])
def test_batched_decoding_preserves_each_rows_distribution(opts, s):
    pvals = _batch_pvalues(opts, s)
    assert min(pvals) > 1e-3, f"p-values {pvals}"


def test_batched_broken_rule_is_caught(monkeypatch):
    import drafttree.accept as A
    import drafttree.batching.decode as BD

    monkeypatch.setattr(BD, "accept", lambda tree, logits, s, g: A.accept_sampling(tree, logits, s, g, _broken=True))
    pvals = _batch_pvalues({"k": 3}, Sampling(1.0))
    assert min(pvals) < 1e-4, f"broken rule not detected in a batch (p-values {pvals})"


def test_draw_samples_the_categorical_distribution_and_never_a_zero():
    """The one-uniform sampler every sampled token goes through: frequencies match, zero mass is never drawn,
    and a seed reproduces the sequence (checked against the distribution, not against torch.multinomial)."""
    from drafttree.categorical import draw

    p = torch.tensor([0.0, 0.5, 1e-3, 0.0, 0.25, 0.149, 0.1, 0.0])
    n = 20000
    g = torch.Generator().manual_seed(3)
    seq = [draw(p, g) for _ in range(n)]
    counts = np.bincount(seq, minlength=p.numel())
    assert counts[p.numpy() == 0].sum() == 0
    keep = p.numpy() > 0
    assert chi2_pvalue(counts[keep], (p[keep] / p.sum()).numpy()) > 1e-3
    g2 = torch.Generator().manual_seed(3)
    assert [draw(p, g2) for _ in range(200)] == seq[:200]
    # unnormalised weights and a one-hot distribution (the last index included)
    assert draw(torch.tensor([0.0, 0.0, 3.0]), g) == 2
    assert {draw(torch.tensor([2.0, 0.0, 2.0]), g) for _ in range(200)} == {0, 2}
