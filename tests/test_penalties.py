"""Penalties, logit_bias, min_tokens and min-p (penalties.py, accept.py): the adjusted distribution as vLLM defines it,
each tree node adjusted for its own path, and every method exact for it (greedy: plain decoding's tokens; sampling:
the adjusted target's distribution, checked against references computed here, and a rule that forgets the path must
fail)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from drafttree import DraftTreeError, SpeculativeModel
from drafttree.accept import Sampling
from drafttree.penalties import LogitAdjust
from drafttree.tree import DraftTree


def naive_adjust(logits: np.ndarray, prompt: list[int], out: list[int], a: LogitAdjust, ends) -> np.ndarray:
    """One row, float64, token by token from the definitions (vLLM's order: bias, min_tokens, repetition over prompt and
    output, then frequency and presence over the output)."""
    z = logits.astype(np.float64).copy()
    for t, b in a.logit_bias:
        z[t] += b
    if len(out) < a.min_tokens:
        for t in ends:
            z[t] = -np.inf
    for t in set(prompt) | set(out):
        z[t] = z[t] / a.repetition_penalty if z[t] > 0 else z[t] * a.repetition_penalty
    for t, c in collections.Counter(out).items():
        z[t] -= a.frequency_penalty * c + a.presence_penalty
    return z


def test_every_node_is_adjusted_for_its_own_path():
    g = torch.Generator().manual_seed(0)
    V = 40
    a = LogitAdjust(presence_penalty=0.7, frequency_penalty=0.4, repetition_penalty=1.3,
                    logit_bias=((3, 2.0), (9, -1.5)), min_tokens=6)
    prompt, out = [1, 2, 3, 4, 5, 3], [7, 8, 7, 9]  # context = prompt + output; the root is the output's last token
    parents = torch.tensor([-1, 0, 0, 1, 3, 2, 5, 3])
    tokens = torch.tensor([9, 7, 11, 12, 7, 3, 30, 1])
    tree = DraftTree.from_parents(tokens, parents)
    logits = torch.randn(len(tokens), V, generator=g) * 3
    got = a.apply(logits, tree.tokens, tree.ancestors, tree.depths, prompt + out, len(prompt), {0, 12})
    for i in range(len(tokens)):
        path = [int(tokens[j]) for j in tree.path_to(i)[1:]]
        want = naive_adjust(logits[i].numpy(), prompt, out + path, a, {0, 12})
        np.testing.assert_allclose(got[i].numpy(), want, rtol=1e-6, atol=1e-5)
    assert LogitAdjust.of() is None and LogitAdjust.of(logit_bias={}) is None


@pytest.mark.parametrize("kwargs", [{"presence_penalty": 3}, {"frequency_penalty": -2.5}, {"repetition_penalty": 0},
                                    {"repetition_penalty": "x"}, {"logit_bias": {"-1": 1}}, {"logit_bias": {"7": 101}},
                                    {"logit_bias": {"abc": 1}}, {"logit_bias": {10**9: 1}}, {"min_tokens": -1},
                                    {"min_tokens": 1.5}, {"min_p": 1.5}, {"min_p": "a"}, {"logit_bias": {"²": 1}},
                                    {"logit_bias": {"--5": 1}}, {"logit_bias": 5}, {"logit_bias": [1, 2]},
                                    {"logit_bias": {"7": 1, "07": 2}},
                                    {"logit_bias": {str(i): 1 for i in range(2000)}}])
def test_bad_settings_are_one_line_errors(default_fp32, kwargs):
    sm = SpeculativeModel(default_fp32, method="lookup")
    with pytest.raises(DraftTreeError) as e:
        sm.generate("Hi", max_new_tokens=2, **kwargs)
    assert "\n" not in str(e.value)


SETTINGS = [
    {"frequency_penalty": 1.0},
    {"presence_penalty": 1.5, "repetition_penalty": 1.3},
    {"repetition_penalty": 0.8, "logit_bias": {"13": 4.0}},
    {"min_tokens": 30, "frequency_penalty": -0.5},
]


@pytest.mark.parametrize("kwargs", SETTINGS, ids=lambda k: ",".join(k))
def test_greedy_every_method_gives_plain_decodings_adjusted_tokens(default_fp32, kwargs):
    sm = SpeculativeModel(default_fp32, method="hybrid")
    prompt = "Write a short poem about the sea, repeating the word sea often."
    plain = sm.generate(prompt, max_new_tokens=40, method="ar", **kwargs)
    assert plain.tokens != sm.generate(prompt, max_new_tokens=40, method="ar").tokens  # the setting changes it
    for method in ("lookup", "hybrid"):
        assert sm.generate(prompt, max_new_tokens=40, method=method, **kwargs).tokens == plain.tokens, method
    both = sm.generate([prompt, "Say hi."], max_new_tokens=40, **kwargs)
    assert both[0].tokens == plain.tokens
    assert both[1].tokens == sm.generate("Say hi.", max_new_tokens=40, method="ar", **kwargs).tokens


def test_min_tokens_holds_the_end_back_and_logit_bias_can_end_at_once(default_fp32):
    sm = SpeculativeModel(default_fp32, method="lookup")
    short = "Reply with just the word: yes"
    natural = sm.generate(short, max_new_tokens=64)
    assert natural.finish_reason == "stop"
    m = len(natural.tokens) + 8
    held = sm.generate(short, max_new_tokens=64, min_tokens=m)
    assert len(held.tokens) >= m and not set(held.tokens[:m]) & sm.eos_ids
    assert held.tokens == sm.generate(short, max_new_tokens=64, min_tokens=m, method="ar").tokens
    eos = sorted(sm.eos_ids)[0]
    assert sm.generate(short, max_new_tokens=8, logit_bias={eos: 100}).tokens == [eos]


def test_seeded_sampling_with_penalties_is_plain_samplings_text(default_fp32):
    sm = SpeculativeModel(default_fp32, method="hybrid")
    prompt = "List ten animals."
    kw = dict(max_new_tokens=40, temperature=1.0, top_p=0.95, min_p=0.05, seed=4, presence_penalty=0.8,
              frequency_penalty=0.3, repetition_penalty=1.2)
    plain = sm.generate(prompt, method="ar", **kw)
    assert sm.generate(prompt, **kw).tokens == plain.tokens
    assert sm.generate([prompt, prompt], **kw)[0].tokens == plain.tokens


# ----------------------------------------------------------- the adjusted distribution on a tiny model, end to end

VOCAB, PROMPT, ENDS = 12, [3, 5, 7, 2], {4}
ADJ = LogitAdjust(presence_penalty=0.9, frequency_penalty=0.6, repetition_penalty=1.6, logit_bias=((1, 1.2),),
                  min_tokens=2)


def _pvalues(s: Sampling, n: int = 2000):
    """The adjusted target's laws of the first three tokens (test_sampling.tree_pvalues), the adjustment from the
    definitions written here."""
    from tests.test_sampling import tree_pvalues

    def next_logits(model, out: list[int]) -> np.ndarray:
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + out])).logits[0, -1].double().numpy()
        return naive_adjust(logits, PROMPT, out, ADJ, ENDS)
    return tree_pvalues(s, next_logits, PROMPT, ENDS, n, seed=11)


@pytest.mark.parametrize("s", [Sampling(1.0, adjust=ADJ), Sampling(0.8, min_p=0.1, adjust=ADJ)],
                         ids=["T1", "T0.8-minp"])
def test_trees_sample_the_adjusted_distribution(s):
    p12, p3 = _pvalues(s)
    assert p12 > 1e-3 and p3 > 1e-3, f"p(first two)={p12:.2e} p(third)={p3:.2e}"


def test_a_rule_that_forgets_each_nodes_path_is_caught(monkeypatch):
    """The tempting bug: every node adjusted for the tokens before the round only, as if it were the root."""
    real = LogitAdjust.apply

    def pathless(self, logits, tokens, ancestors, depths, context, prompt_len, end_ids):
        root_only = torch.zeros_like(ancestors)
        root_only[:, 0] = True
        return real(self, logits, tokens, root_only, torch.zeros_like(depths), context, prompt_len, end_ids)

    monkeypatch.setattr(LogitAdjust, "apply", pathless)
    p12, p3 = _pvalues(Sampling(1.0, adjust=ADJ), n=1500)
    assert min(p12, p3) < 1e-4, f"a path-blind adjustment went unnoticed (p={p12:.2e}, {p3:.2e})"
