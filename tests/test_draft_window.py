"""A draft LM that reads only the context's last tokens (``draft_window``), or whose own context window is shorter
than the target's: what it holds, and that decoding with it stays exact."""

from __future__ import annotations

import copy

import pytest
import torch

from drafttree.api import SpeculativeModel
from drafttree.drafters.draft_model import DRAFT_HEADROOM, DraftLMState
from drafttree.errors import DraftTreeError
from drafttree.models import LoadedModel
from tests.conftest import tiny_causal_lm
from tests.test_architectures import IdsTokenizer

V = 64


class Vocab(IdsTokenizer):
    """Token ids as text, with the vocabulary a draft must share with its target."""

    def get_vocab(self) -> dict[str, int]:
        return {f"<{i}>": i for i in range(V)}


def _pair(draft_positions: int = 256):
    target = LoadedModel(tiny_causal_lm("llama", vocab=V, seed=0), Vocab(), "tiny-target", "")
    draft_model = copy.deepcopy(target.model)  # the target's weights a little perturbed: it agrees often, not always
    with torch.no_grad():
        for p in draft_model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    draft_model.config.max_position_embeddings = draft_positions
    return target, LoadedModel(draft_model, Vocab(), "tiny-draft", "")


def test_a_fresh_prefill_reads_the_windows_last_tokens_then_follows_the_context():
    _, draft = _pair()
    state = DraftLMState(draft.model, V)
    context = torch.randint(2, V, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    lp = state.catch_up(context, window=8)
    assert state.lm.length == 8 and state.fed == 30
    alone = DraftLMState(draft.model, V)  # the same 8 tokens as the whole context: the same distribution
    assert torch.allclose(lp, alone.catch_up(context[-8:]), atol=1e-5)
    state.catch_up(context + [5, 6, 7], window=8)
    assert state.lm.length == 11 and state.fed == 33  # the new tokens only, after what it holds
    state.reset()
    state.catch_up(context[:5], window=8)  # a shorter context than the window: all of it
    assert state.lm.length == 5


def test_with_keep_prefix_a_next_turn_extends_what_the_cache_holds_while_that_costs_no_more_than_a_window():
    _, draft = _pair()
    state = DraftLMState(draft.model, V)
    state.keep(True)
    context = torch.randint(2, V, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    state.catch_up(context, window=8)
    assert (state.start, state.lm.length) == (22, 8)
    state.reset()  # the next turn: 5 tokens more, cheaper to extend than a fresh window of 8
    state.catch_up(context + [9, 8, 7, 6, 5], window=8)
    assert (state.start, state.lm.length) == (22, 13)
    state.reset()  # 10 more again: extending (18) would cost more than a fresh window
    longer = context + [9, 8, 7, 6, 5] + list(range(10, 20))
    lp = state.catch_up(longer, window=8)
    assert (state.start, state.lm.length) == (len(longer) - 8, 8)
    assert torch.allclose(lp, DraftLMState(draft.model, V).catch_up(longer[-8:]), atol=1e-5)


def test_a_draft_with_a_short_context_window_starts_again_from_the_contexts_last_tokens():
    _, draft = _pair(draft_positions=DRAFT_HEADROOM + 16)
    state = DraftLMState(draft.model, V)  # no window asked for: the draft's own limit still holds
    context = torch.randint(2, V, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    state.catch_up(context)
    assert state.lm.length == 16 and state.fed == 40
    state.catch_up(context + [3])  # would overflow its positions with a round's slots: a fresh start
    assert state.lm.length == 16 and state.fed == 41


@pytest.mark.parametrize("method,options", [("draft", {"window": 6}), ("draft", {"window": 6, "tree": True}),
                                            ("hybrid", {"draft_window": 6}), ("hybrid", None)])
def test_decoding_with_a_windowed_or_short_draft_is_exact(method, options):
    # the draft holds 88 positions, the target 256: the prompt alone is longer than the draft's context window (until
    # stop 82 its prefill raised), and the draft starts again from the context's last tokens as the answer grows
    target, draft = _pair(draft_positions=DRAFT_HEADROOM + 24)
    sm = SpeculativeModel(target, method="ar", draft=draft)
    prompt = torch.randint(2, V, (100,), generator=torch.Generator().manual_seed(2))
    plain = sm.generate(prompt, max_new_tokens=60, ignore_eos=True).tokens
    res = sm.generate(prompt, max_new_tokens=60, method=method, method_options=options, ignore_eos=True)
    assert res.tokens == plain
    if method == "draft":
        assert res.target_forwards < len(plain), "the draft never got a token accepted"
        assert sm.drafter(method, options).state.lm.length <= DRAFT_HEADROOM + 24
    sampled = sm.generate(prompt, max_new_tokens=40, ignore_eos=True, temperature=1.0, seed=3).tokens
    assert sm.generate(prompt, max_new_tokens=40, method=method, method_options=options, ignore_eos=True,
                       temperature=1.0, seed=3).tokens == sampled


def test_a_negative_window_is_refused_in_one_line():
    target, draft = _pair()
    sm = SpeculativeModel(target, method="ar", draft=draft)
    with pytest.raises(DraftTreeError, match="window"):
        sm.generate(torch.tensor([3, 4, 5]), max_new_tokens=4, method="hybrid", method_options={"draft_window": -1})


def test_the_auto_window_reads_what_an_eighth_of_the_answers_decoding_time_pays_for():
    from drafttree.sources.model_sources import MIN_WINDOW, PREFILL_PROBE, PREFILL_SHARE, DraftLMSource

    _, draft = _pair()
    cpu_like = lambda n: max(1.0, n / 10)  # noqa: E731 - 64 tokens cost 6.4 one-token forwards: compute-bound
    src = DraftLMSource(draft.model, V, target_params=3 * sum(p.numel() for p in draft.model.parameters()),
                        cost_curve=cpu_like)
    per_token = (1 / 3) * cpu_like(PREFILL_PROBE) / PREFILL_PROBE  # a draft prefill token, in target steps
    assert src.prefill_window(128) == int(PREFILL_SHARE * 128 / per_token)
    assert src.prefill_window(256) == 2 * src.prefill_window(128), "a longer answer pays for a longer read"
    assert src.prefill_window(1) == MIN_WINDOW
    params = 3 * sum(p.numel() for p in draft.model.parameters())
    gpu_like = DraftLMSource(draft.model, V, target_params=params, cost_curve=lambda n: 1.0 + n / 1000)
    assert gpu_like.prefill_window(128) > 5 * src.prefill_window(128), "where prefill is cheap it reads far more"
    assert DraftLMSource(draft.model, V, 1, cost_curve=None).prefill_window(128) == 0  # nothing to cost it by: all
    assert DraftLMSource(draft.model, V, 1, window=300, cost_curve=cpu_like).prefill_window(128) == 300
