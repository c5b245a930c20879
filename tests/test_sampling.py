"""Speculative sampling is lossless: distributions of sampled tokens equal the target's.

Part 1 drives the acceptance rule directly with synthetic bigram "models" (fast, many draws, many tree
shapes, several rounds per draw). Part 2 runs the whole decode loop on tiny random transformers models with a
draft that often disagrees. A deliberately broken rule must fail the same check. The reference distributions
are computed from the models' logits with softmax and products, not with the code under test; the noise
(drafttree.noise) is checked on its own against the Gumbel law.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from drafttree.accept import Sampling, accept_sampled, sample_token
from drafttree.noise import CoupledStepper, Noise
from drafttree.tree import DraftTree
from tests.conftest import chi2_pvalue, reference_warp, tiny_causal_lm

V = 6


def bigram(seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, V, generator=g) * scale  # logits[prev, next]


def reference(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The warped distribution of one row, from the tests' own code (conftest.reference_warp)."""
    return torch.from_numpy(reference_warp(logits.detach().double().numpy()[None], s)[0])


def exact_two_tokens(P: torch.Tensor, root: int, s: Sampling) -> np.ndarray:
    p1 = reference(P[root], s)
    out = np.zeros((V, V))
    for a in range(V):
        out[a] = (p1[a] * reference(P[a], s)).numpy()
    return out.reshape(-1)


class BigramStepper:
    """A draft "model" over the bigram logits Q, as the tree builders see a drafter."""

    vocab_ids = None

    def __init__(self, Q: torch.Tensor, root: int):
        self.Q, self.root = Q, root

    def root_logprobs(self) -> torch.Tensor:
        return torch.log_softmax(self.Q[self.root], -1)

    def expand(self, tokens, parent_slots, attend, depth):
        return torch.log_softmax(self.Q[tokens], -1)


def round_tree(Q, root, s, shape, noise, pos) -> DraftTree:
    if shape == "coupled-chain":  # the draft's own sample under the target's noise, three deep
        st = CoupledStepper(BigramStepper(Q, root), s, noise, pos)
        toks, lp = [], st.root_logprobs()
        for d in range(3):
            toks.append(int(lp.argmax()))
            lp = st.expand(torch.tensor([toks[-1]]), None, None, d + 1)[0]
        return DraftTree.chain(root, toks)
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
    return DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents))


def run_accept(P, Q, root, s, shape, n, seed, broken=False):
    """Draw ``n`` two-token continuations of ``root`` (at position 0), each with fresh noise, round after round
    through accept_sampled; returns counts over V*V cells and the accepted drafts."""
    counts = np.zeros(V * V)
    accepted = 0
    for i in range(n):
        noise = Noise(seed * 100003 + i, V)
        seq, pos, r = [], 0, root
        while len(seq) < 2:
            tree = round_tree(Q, r, s, shape, noise, pos)
            path, nxt = accept_sampled(tree, P[tree.tokens], s, noise, pos, _broken=broken)
            new = tree.tokens[path[1:]].tolist() + [nxt]
            accepted += len(path) - 1
            seq += new
            pos, r = pos + len(new), nxt
        counts[seq[0] * V + seq[1]] += 1
    return counts, accepted


SETTINGS = [Sampling(1.0), Sampling(0.7), Sampling(1.5, top_p=0.8), Sampling(1.0, top_k=3)]


@pytest.mark.parametrize("shape", ["coupled-chain", "point-tree", "point-chain"])
@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"T{s.temperature}-p{s.top_p}-k{s.top_k}")
def test_acceptance_rule_preserves_distribution(shape, s):
    P, Q = bigram(0), bigram(1)  # draft disagrees with the target
    counts, accepted = run_accept(P, Q, 2, s, shape, n=6000, seed=11)
    assert accepted > 0
    p = chi2_pvalue(counts, exact_two_tokens(P, 2, s))
    assert p > 1e-3, f"distribution mismatch, chi-square p={p:.2e}"


@pytest.mark.parametrize("shape", ["point-chain", "point-tree"])
def test_broken_rule_is_caught(shape):
    """Noise keyed by the depth in the round instead of the position looks plausible and is wrong (a rejected
    round's next token reuses the noise the round before used); the same check must fail."""
    P, Q = bigram(0), bigram(1)
    s = Sampling(1.0)
    counts, _ = run_accept(P, Q, 2, s, shape, n=6000, seed=11, broken=True)
    p = chi2_pvalue(counts, exact_two_tokens(P, 2, s))
    assert p < 1e-6, f"the broken rule was not detected (p={p:.2e})"


def test_drafts_equal_to_the_target_are_always_accepted():
    """With the draft's distribution equal to the target's, its sample under the same noise is the target's."""
    P = bigram(0)
    _, accepted = run_accept(P, P, 2, Sampling(1.0), "coupled-chain", n=300, seed=0)
    assert accepted == 900  # every round's whole chain of three, one round per draw


def test_output_does_not_depend_on_the_drafts():
    """Same noise, any tree: the same tokens (what plain sampling gives), drafts only change the rounds."""
    P, Q = bigram(0), bigram(1)
    s = Sampling(1.0)
    for i in range(200):
        outs = []
        for shape in ("coupled-chain", "point-tree", "point-chain", "none"):
            noise, seq, pos, r = Noise(i, V), [], 0, 2
            while len(seq) < 4:
                tree = DraftTree.root_only(r) if shape == "none" else round_tree(Q, r, s, shape, noise, pos)
                path, nxt = accept_sampled(tree, P[tree.tokens], s, noise, pos)
                new = tree.tokens[path[1:]].tolist() + [nxt]
                seq += new
                pos, r = pos + len(new), nxt
            outs.append(seq[:4])
        assert all(o == outs[-1] for o in outs), outs


@pytest.mark.parametrize("draft_vocab", ["full", "permuted", "fewer rows"])
def test_every_tree_builder_drafts_the_targets_sample_when_the_draft_is_the_target(draft_vocab):
    """Through the noise, a draft equal to the target proposes exactly the target's samples, whatever builds the
    tree (chain, EAGLE-1 static, EAGLE-2 dynamic): the whole top-1 path is accepted. Checks the positions each builder
    asks for, a reduced draft vocabulary (``vocab_ids``) and a draft with fewer output rows."""
    from drafttree.tree import grow_chain, grow_dynamic_tree, grow_static_tree

    P = bigram(0)
    P[:, V - 1] = -40.0  # a token the target never samples, so that a draft without its row can match every sample
    s = Sampling(1.0)

    class Draft(BigramStepper):
        vocab_ids = torch.randperm(V, generator=torch.Generator().manual_seed(1)) if draft_vocab == "permuted" else None

        def _view(self, lp):
            if draft_vocab == "permuted":
                return lp[..., self.vocab_ids]
            return lp[..., : V - 1] if draft_vocab == "fewer rows" else lp

        def root_logprobs(self):
            return self._view(super().root_logprobs())

        def expand(self, tokens, parent_slots, attend, depth):
            return self._view(super().expand(tokens, parent_slots, attend, depth))

    builders = {"chain": lambda st, r: grow_chain(st, r, 3),
                "static": lambda st, r: grow_static_tree(st, r, [[0], [1], [0, 0], [0, 1], [0, 0, 0]]),
                "dynamic": lambda st, r: grow_dynamic_tree(st, r, 3, 2, 11)}
    for name, build in builders.items():
        for i in range(30):
            noise, pos, r = Noise(1000 + i, V), 5, 2
            tree = build(CoupledStepper(Draft(P, r), s, noise, pos), r)
            path, _ = accept_sampled(tree, P[tree.tokens], s, noise, pos)
            assert len(path) == 4, f"{name}: the target's samples were not all drafted (path {path})"


def test_noise_is_gumbel_per_position_and_reproducible():
    """Each position's noise is standard Gumbel (argmax(log p + g) follows p), positions are independent, and a
    seed gives the same noise again, in any order of requests."""
    p = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])
    n = 4000
    a, b = Noise(7, 5), Noise(7, 5)
    firsts = [sample_token(p.log(), Sampling(1.0), a, k) for k in range(n)]
    assert chi2_pvalue(np.bincount(firsts, minlength=5), p.numpy()) > 1e-3
    pairs = np.zeros(25)
    for k in range(0, n, 2):
        pairs[firsts[k] * 5 + firsts[k + 1]] += 1
    assert chi2_pvalue(pairs, np.outer(p, p).reshape(-1)) > 1e-3  # neighbouring positions independent
    assert [sample_token(p.log(), Sampling(1.0), b, k) for k in reversed(range(n))][::-1] == firsts
    assert not torch.equal(Noise(8, 5).at(0), a.at(0))
    assert torch.equal(a.at(0), Noise(7, 5).at(0)), "a block regenerated after eviction is the same noise"


# ------------------------------------------------------------------- end to end on tiny transformers models


def broken_accept(tree, logits, sampling, noise, pos, best=None):
    return accept_sampled(tree, logits, sampling, noise, pos, _broken=True)


def _exact_prefix_dist(model, prompt: list[int], s: Sampling, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact joint distribution of the first two sampled tokens and the marginal of the third."""
    with torch.no_grad():
        p1 = reference(model(torch.tensor([prompt])).logits[0, -1], s).float()
        seqs = torch.tensor([prompt + [a] for a in range(vocab)])
        p2 = torch.stack([reference(row, s) for row in model(seqs).logits[:, -1]]).float()  # [a, b]
        joint = p1[:, None] * p2
        seqs3 = torch.tensor([prompt + [a, b] for a, b in itertools.product(range(vocab), range(vocab))])
        p3 = torch.stack([reference(row, s) for row in model(seqs3).logits[:, -1]]).float()  # [(a,b), c]
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
    import drafttree.decode as D

    monkeypatch.setattr(D, "accept", broken_accept)
    p12, p3, _ = _decode_loop_pvalues({"k": 3}, Sampling(1.0))
    assert min(p12, p3) < 1e-4, f"broken rule not detected end to end (p={p12:.2e}, {p3:.2e})"


def _decode_loop_pvalues(opts, s, n: int = 2500, drafter=None, target=None):
    from drafttree.drafters.draft_model import DraftModelDrafter
    from drafttree.target import TargetModel

    vocab = 12
    if target is None:
        target = tiny_causal_lm("llama", vocab=vocab, hidden=32, seed=0)
    if drafter is None:
        draft = tiny_causal_lm("llama", vocab=vocab, hidden=32, seed=7)  # an unrelated draft: disagrees often
        drafter = DraftModelDrafter(draft, vocab, **opts)
    prompt = [3, 5, 7, 2]
    c12, c3, rate = count_first_three(TargetModel(target), drafter, prompt, s, n, vocab)
    joint, third = _exact_prefix_dist(target, prompt, s, vocab)
    return chi2_pvalue(c12, joint), chi2_pvalue(c3, third), rate


def count_first_three(tm, drafter, prompt: list[int], s: Sampling, n: int, vocab: int, seed: int = 123,
                      max_new_tokens: int = 3, eos_ids=frozenset()):
    """Over n decodes from one seeded generator: counts of the first two tokens (joint, a * vocab + b) and of the
    third (where there is one), and the share of drafted tokens accepted."""
    from drafttree.decode import DecodeStats, decode

    g = torch.Generator().manual_seed(seed)
    c12, c3 = np.zeros(vocab * vocab), np.zeros(vocab)
    drafted = accepted = 0
    for _ in range(n):
        out: list[int] = []
        stats = DecodeStats()
        for new in decode(tm, drafter, torch.tensor(prompt), s, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                          generator=g, stats=stats):
            out.extend(new)
        drafted += sum(t - 1 for t in stats.tree_sizes)
        accepted += sum(a - 1 for a in stats.accept_lengths)
        c12[out[0] * vocab + out[1]] += 1
        if len(out) > 2:
            c3[out[2]] += 1
    return c12, c3, accepted / max(1, drafted)


def tree_pvalues(s: Sampling, next_logits, prompt: list[int], ends, n: int = 2000, seed: int = 11,
                 vocab: int = 12) -> tuple[float, float]:
    """Chi-square p-values of the first two tokens' joint law and of the third's, decoding a tiny target with depth-3
    trees with siblings from an unrelated tiny draft LM, against the laws computed here: ``next_logits(model, out)``
    gives the float64 logits (adjusted as the test defines, -inf where forbidden) of the token after ``out``."""
    from drafttree.drafters.draft_model import DraftModelDrafter
    from drafttree.target import TargetModel

    target = tiny_causal_lm("llama", vocab=vocab, hidden=32, seed=0)
    draft = tiny_causal_lm("llama", vocab=vocab, hidden=32, seed=7)  # an unrelated draft: disagrees often
    drafter = DraftModelDrafter(draft, vocab, k=3, tree=True, top_k=3, total_tokens=8)  # depth-3 trees, siblings
    c12, c3, rate = count_first_three(TargetModel(target), drafter, prompt, s, n, vocab, seed=seed, max_new_tokens=4,
                                      eos_ids=ends)
    assert 0.02 < rate < 0.98, f"drafts should be accepted sometimes (rate {rate:.2f})"

    def dist(out: list[int]) -> np.ndarray:
        return reference_warp(next_logits(target, out)[None], s)[0]
    p1 = dist([])
    joint, third = np.zeros((vocab, vocab)), np.zeros(vocab)
    for a, b in itertools.product(range(vocab), range(vocab)):
        if p1[a] == 0:
            continue
        pab = p1[a] * dist([a])[b]
        joint[a, b] = pab
        if pab > 0:
            third += pab * dist([a, b])
    return chi2_pvalue(c12, joint.reshape(-1)), chi2_pvalue(c3, third / third.sum())


@pytest.mark.parametrize("method,opts,s", [
    ("eagle2", {"depth": 3, "top_k": 3, "total_tokens": 8}, Sampling(1.0)),
    ("eagle2", {"depth": 2, "top_k": 5, "total_tokens": 10}, Sampling(0.7, top_p=0.9)),
    ("eagle1", {"depth": 3}, Sampling(1.3, top_k=6)),
    ("eagle-chain", {"depth": 3}, Sampling(1.0)),
])
def test_eagle_trees_preserve_the_distribution(method, opts, s):
    """EAGLE trees and the EAGLE chain, drafted through the target's noise."""
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
    import drafttree.decode as D
    from drafttree.drafters.eagle import make_eagle_drafter
    from drafttree.heads.model import EagleHead
    from drafttree.models import LoadedModel

    monkeypatch.setattr(D, "accept", broken_accept)
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
    ({"k": 3}, Sampling(1.0)),  # the draft LM's chain through the noise
    ({"k": 3, "tree": True, "top_k": 3, "total_tokens": 8}, Sampling(0.9, top_p=0.95)),  # top-k trees
])
def test_batched_decoding_preserves_each_rows_distribution(opts, s):
    pvals = _batch_pvalues(opts, s)
    assert min(pvals) > 1e-3, f"p-values {pvals}"


def test_batched_broken_rule_is_caught(monkeypatch):
    import drafttree.batching.decode as BD

    monkeypatch.setattr(BD, "accept", broken_accept)
    pvals = _batch_pvalues({"k": 3}, Sampling(1.0))
    assert min(pvals) < 1e-4, f"broken rule not detected in a batch (p-values {pvals})"


def test_small_temperatures_split_a_tie_evenly():
    """Two tied logits of 24 at T = 1e-6 (the least temperature allowed): unshifted, logits / T = 2.4e7 sits on
    float32's grid of 2, so logits / T + noise ties about half the time and the first index took ~75% of the samples."""
    noise = Noise(seed=11, vocab=8)
    logits = torch.tensor([24.0, 24.0, 0.0, -3.0, 1.0, 2.0, 0.5, -1.0])
    n = 4000
    first = sum(sample_token(logits, Sampling(1e-6), noise, k) == 0 for k in range(n))
    assert abs(first / n - 0.5) < 0.03, first / n
