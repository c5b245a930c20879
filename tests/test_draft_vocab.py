"""``draft_vocab=N`` / ``--draft-vocab N`` (heads.restrict_draft_vocab): a head that drafts with the target's LM head (a
model's own MTP layer here) drafts over the first N token ids and the special ones only. Its distribution is the full
one renormalised over those ids, every drafted token is one of them, every method still gives plain decoding's tokens
(greedy, a list, T=1 with a seed), and misuse is one line before anything is drafted."""

from __future__ import annotations

import pytest
import torch
from test_assistant import Recording
from test_mtp import BIAS, N, _build, _prompts, _target

from drafttree.api import SpeculativeModel
from drafttree.drafters import make_drafter
from drafttree.drafters.eagle import state_for
from drafttree.errors import DraftTreeError
from drafttree.heads import load_head_for, restrict_draft_vocab

SIZE = 48  # of the tiny targets' 96 tokens; the logit bias's tokens 5 and 9 among them


@pytest.fixture(scope="module", params=["deepseek", "qwen3_next"])  # the checkpoint's own LM head; the target's
def built(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "model"
    _build(request.param, path, own_head=request.param == "deepseek")
    target = _target(path)
    target.model.generation_config.eos_token_id = 90  # a special id past the first SIZE: kept too (decoding ignores it)
    return target


def test_the_drafts_are_the_full_distribution_over_the_kept_ids(built):
    target = built
    full, head = load_head_for(target, "mtp"), load_head_for(target, "mtp")
    restrict_draft_vocab(head, SIZE, target)
    kept = head.draft_vocab
    assert kept.tolist() == [*range(SIZE), 90]
    ids = _prompts()[1].tolist()
    with torch.no_grad():
        feats = target.model.base_model(torch.tensor([ids[:-1]])).last_hidden_state[0]
        states = [state_for(h) for h in (full, head)]
        for st in states:
            st.encode(feats, ids[1:], 0)
        lp_full, lp = (st.root_logprobs() for st in states)
        torch.testing.assert_close(lp, torch.log_softmax(lp_full[kept], -1))
        deeper = [st.expand(torch.tensor([7]), torch.tensor([-1]), torch.ones(1, 1, dtype=torch.bool), 1)[0]
                  for st in states]
        torch.testing.assert_close(deeper[1], torch.log_softmax(deeper[0][kept], -1))


@pytest.mark.parametrize("method", ["eagle-chain", "eagle2", "auto"])
def test_every_method_gives_plain_decodings_tokens_with_a_smaller_draft_vocab(built, method):
    target = built
    head = load_head_for(target, "mtp")
    restrict_draft_vocab(head, SIZE, target)
    sm = SpeculativeModel(target, method=method, head=head)
    prompts = _prompts()
    for bias in (None, BIAS):
        plain = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, logit_bias=bias).tokens
                 for p in prompts]
        assert [sm.generate(p, max_new_tokens=N, ignore_eos=True, logit_bias=bias).tokens for p in prompts] == plain
        assert [r.tokens for r in sm.generate(list(prompts), max_new_tokens=N, ignore_eos=True,
                                              logit_bias=bias)] == plain
    alone = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, temperature=1.0, seed=3).tokens
             for p in prompts]
    assert [sm.generate(p, max_new_tokens=N, ignore_eos=True, temperature=1.0, seed=3).tokens
            for p in prompts] == alone
    if method == "eagle-chain":  # every drafted token is a kept one
        drafter = Recording(make_drafter("eagle-chain", target, head=head, depth=3))
        for p in prompts:
            sm.generate(p, max_new_tokens=N, ignore_eos=True, drafter=drafter)
        drafted = [t for _, chain in drafter.rounds for t in chain]
        assert drafted and set(drafted) <= set(head.draft_vocab.tolist())


def test_draft_vocab_misuse_is_one_line(built):
    target = built
    head = load_head_for(target, "mtp")
    for size, match in ((0, "positive number"), (-3, "positive number"), (True, "positive number"),
                        ("32", "positive number"), (97, "more than the target's 96 tokens")):
        with pytest.raises(DraftTreeError, match=match) as e:
            restrict_draft_vocab(head, size, target)
        assert "\n" not in str(e.value)
    with pytest.raises(DraftTreeError, match="none drafts here"):
        restrict_draft_vocab(None, SIZE, target)
    restrict_draft_vocab(head, SIZE, target)
    with pytest.raises(DraftTreeError, match=r"its own draft vocabulary of \d+ tokens"):
        restrict_draft_vocab(head, 20, target)
    with pytest.raises(DraftTreeError, match="positive number"):  # before any model loads
        SpeculativeModel.from_pretrained("no-such-model", draft_vocab=0)
