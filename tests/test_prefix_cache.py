"""Prefix caching: a prompt that begins with what the cache holds computes only the rest, and the model reads the
same as after a fresh prefill (features for every position included, which the drafters need)."""

from __future__ import annotations

import pytest
import torch

from drafttree.api import SpeculativeModel
from drafttree.drafters.draft_model import DraftLMState
from drafttree.errors import DraftTreeError
from drafttree.target import TargetModel, common_prefix
from drafttree.tree import DraftTree
from tests.conftest import tiny_causal_lm

ARCHS = ["llama", "qwen2", "gemma3"]  # gemma3: sliding-window layers read their window through the mask


def _ids(n: int, seed: int, vocab: int = 50) -> torch.Tensor:
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _decode_a_tree(tm: TargetModel, seed: int) -> list[int]:
    """One verify round: a random tree forwarded, its deepest path committed; the committed tokens."""
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, 9)]
    tree = DraftTree.from_parents(torch.randint(2, 50, (9,), generator=g), torch.tensor(parents))
    tm.forward_tree(tree.tokens, tree.depths, tree.ancestors)
    path = tree.path_to(int(tree.depths.argmax()))
    tm.commit(path)
    return tree.tokens[path].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_a_prompt_extending_the_cache_reads_as_after_a_fresh_prefill(arch):
    model = tiny_causal_lm(arch, vocab=50, seed=3)
    cached, fresh = TargetModel(model, keep_prefix=True), TargetModel(model)
    first = _ids(11, 0)
    cached.prefill(first)
    assert cached.reused == 0
    held = first.tolist() + _decode_a_tree(cached, 1) + _decode_a_tree(cached, 2)
    assert cached.prefix.ids == held and cached.length == len(held)
    second = torch.tensor(held + _ids(7, 5).tolist())  # the earlier turn, its answer, then a new turn
    out = cached.prefill(second)
    ref = fresh.prefill(second)
    assert cached.reused == len(held)
    assert out.features.shape == ref.features.shape
    torch.testing.assert_close(out.logits, ref.logits, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(out.features, ref.features, atol=2e-4, rtol=1e-4)
    tree = DraftTree.chain(9, torch.tensor([10, 11, 12]))  # and decoding goes on the same from there
    torch.testing.assert_close(cached.forward_tree(tree.tokens, tree.depths, tree.ancestors).logits,
                               fresh.forward_tree(tree.tokens, tree.depths, tree.ancestors).logits,
                               atol=2e-4, rtol=1e-4)


def test_the_common_prefix_is_kept_wherever_the_prompts_part():
    model = tiny_causal_lm("llama", vocab=50, seed=4)
    tm = TargetModel(model, keep_prefix=True)
    a = _ids(20, 1)
    tm.prefill(a)
    _decode_a_tree(tm, 3)
    b = torch.cat([a[:12], _ids(6, 9)])  # parts from the cache after 12 tokens
    b[12] = (int(a[12]) + 1) % 48 + 2
    out = tm.prefill(b)
    assert tm.reused == 12 and tm.prefix.ids == b.tolist() and tm.length == b.numel()
    torch.testing.assert_close(out.logits, TargetModel(model).prefill(b).logits, atol=2e-4, rtol=1e-4)
    tm.prefill(b)  # the same prompt again: all but its last token (whose logits are the answer's start)
    assert tm.reused == b.numel() - 1
    tm.prefill(b[:5])  # a shorter prompt inside the cache
    assert tm.reused == 4 and tm.length == 5
    tm.prefill(_ids(8, 11))  # nothing in common: a fresh prefill
    assert tm.reused == 0
    off = TargetModel(model)
    off.prefill(a)
    off.prefill(a)
    assert off.reused == 0 and off.prefix is None


def test_a_short_prefix_of_a_long_prompt_is_computed_afresh():
    """The rest of a prompt runs on the tree path, dearer per token than a prompt's own: a prefix is kept only where
    the rest is short or the prefix a large enough share."""
    model = tiny_causal_lm("llama", vocab=50, seed=9)
    tm = TargetModel(model, keep_prefix=True)
    a = _ids(80, 5)
    tm.prefill(a)
    tm.prefill(torch.cat([a[:10], _ids(190, 6)]))  # 10 of 200 in common, 190 to run
    assert tm.reused == 0
    tm.prefill(a)
    tm.prefill(torch.cat([a[:25], _ids(175, 7)]))  # 25 of 200: an eighth
    assert tm.reused == 25


def test_uncommitted_tree_slots_are_never_reused():
    model = tiny_causal_lm("qwen2", vocab=50, seed=5)
    tm = TargetModel(model, keep_prefix=True)
    a = _ids(10, 2)
    tm.prefill(a)
    tree = DraftTree.chain(7, torch.tensor([8, 9]))
    tm.forward_tree(tree.tokens, tree.depths, tree.ancestors)  # verified, never committed (a stopped generation)
    b = torch.tensor(a.tolist() + [7, 8, 9, 4])
    out = tm.prefill(b)
    assert tm.reused == a.numel()
    torch.testing.assert_close(out.logits, TargetModel(model).prefill(b).logits, atol=2e-4, rtol=1e-4)


def test_features_of_several_layers_are_cached_too():
    """An EAGLE-3 head drafts from several layers' inputs side by side: those are what the cache keeps."""
    model = tiny_causal_lm("llama", vocab=50, layers=4, seed=6)
    cached, fresh = TargetModel(model, [0, 2, 3], keep_prefix=True), TargetModel(model, [0, 2, 3])
    a = _ids(9, 4)
    cached.prefill(a)
    held = a.tolist() + _decode_a_tree(cached, 8)
    b = torch.tensor(held + [5, 6])
    out, ref = cached.prefill(b), fresh.prefill(b)
    assert cached.reused == len(held) and out.features.shape == (b.numel(), 3 * 32)
    torch.testing.assert_close(out.features, ref.features, atol=2e-4, rtol=1e-4)


def test_the_draft_lm_feeds_a_new_context_from_where_it_parts():
    model = tiny_causal_lm("llama", vocab=50, seed=7)
    state, fresh = DraftLMState(model, 50), DraftLMState(model, 50)
    state.keep(True)  # the target's prefix_cache (SpeculativeModel passes it on to its drafters)
    first = _ids(12, 3).tolist()
    state.catch_up(first)
    state.reset()  # the next generation
    second = first + _ids(5, 6).tolist()
    lp = state.catch_up(second)
    assert state.lm.reused == len(first)
    torch.testing.assert_close(lp, fresh.catch_up(second), atol=2e-4, rtol=1e-4)
    fresh.reset()  # without keep_prefix every generation prefills its whole context
    fresh.catch_up(second)
    assert fresh.lm.reused == 0


def test_prefix_cache_must_be_a_bool(default_fp32):
    with pytest.raises(DraftTreeError, match="prefix_cache must be true or false"):
        SpeculativeModel(default_fp32, method="ar", prefix_cache="yes")


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


# ------------------------------------------------------------------ the batch decoder's pool (the server's path)

def test_the_pool_keeps_the_newest_within_its_budget_and_matches_the_longest_prefix():
    from drafttree.batching.prefix_pool import PrefixEntry, PrefixPool

    def entry(ids):
        return PrefixEntry(list(ids), [], torch.zeros(len(ids), 2))

    pool = PrefixPool(max_tokens=110, min_match=4, min_share=0.0)
    pool.add(entry(range(3)))  # shorter than a match: not kept
    assert not pool.entries
    pool.add(entry(range(40)))
    pool.add(entry(range(100, 150)))
    pool.add(entry(range(50)))  # extends the first: replaces it
    assert [len(e.ids) for e in pool.entries] == [50, 50]
    hit = pool.best(list(range(30)) + [7, 7])
    assert hit is not None and hit[1] == 30 and hit[0].ids[:3] == [0, 1, 2]
    assert pool.best(list(range(100, 103)) + [0]) is None  # 3 tokens in common < min_match
    assert pool.best(list(range(50)))[1] == 49  # all but the last token (its logits start the answer)
    pool.add(entry(range(200, 260)))  # over budget: the least recently used goes (the 100.. one)
    assert [e.ids[0] for e in pool.entries] == [0, 200]
    with pytest.raises(DraftTreeError, match="positive"):
        PrefixPool(max_tokens=0)
    shared = PrefixPool(min_match=4)  # min_share 0.5: a short shared head of a long prompt is no match
    shared.add(entry(range(10)))
    assert shared.best(list(range(10)) + [5] * 30) is None and shared.best(list(range(10)) + [5] * 9)[1] == 10


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_newcomer_that_begins_as_a_finished_row_starts_from_its_states(arch):
    from drafttree.batching import BatchDecoder, BatchTarget, Sequence
    from drafttree.batching.prefix_pool import PrefixPool
    from drafttree.drafters.base import Drafter

    model = tiny_causal_lm(arch, vocab=50, seed=8)
    pooled = BatchTarget(model, prefix_pool=PrefixPool(min_match=4))
    dec = BatchDecoder(pooled)
    first = Sequence(_ids(14, 1), Drafter(), max_new_tokens=6)
    other = Sequence(_ids(9, 2), Drafter(), max_new_tokens=3)
    dec.add_many([first, other])
    assert pooled.last_reused == [0, 0]
    while dec.rows:
        dec.step()
    assert len(pooled.pool.entries) == 2
    held = first.context[: first.prompt_ids.numel() + len(first.tokens) - 1]  # its cache: all but the last root
    assert pooled.pool.entries[0].ids == held or pooled.pool.entries[1].ids == held
    turn = torch.tensor(first.context + _ids(5, 3).tolist())  # the conversation's next turn
    stranger = _ids(8, 4)
    outs = pooled.add_many([stranger, turn])
    assert pooled.last_reused == [0, len(held)]
    fresh = BatchTarget(model).add_many([stranger, turn])
    for out, ref in zip(outs, fresh):
        assert out.features.shape == ref.features.shape
        torch.testing.assert_close(out.logits, ref.logits, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(out.features, ref.features, atol=2e-4, rtol=1e-4)


def test_batched_chat_turns_with_the_prefix_cache_are_lossless(default_fp32):
    """The server's path: a batch of conversations, then their next turns as a batch; the later turns start from
    the pool and every answer is plain decoding's."""
    from drafttree.heads import load_head_for

    head = load_head_for(default_fp32)
    plain = SpeculativeModel(default_fp32, method="ar")
    cached = SpeculativeModel(default_fp32, head=head, prefix_cache=True)
    convs = [[{"role": "user", "content": "Name two planets."}],
             [{"role": "user", "content": "Write a line about rain."}]]
    for turn in ("Which one is bigger?", "Now make it rhyme."):
        results = cached.generate(convs, max_new_tokens=24)
        for conv, res in zip(convs, results):
            assert res.tokens == plain.generate(conv, max_new_tokens=24).tokens
            conv += [{"role": "assistant", "content": res.text}, {"role": "user", "content": turn}]
    results = cached.generate(convs, max_new_tokens=24)
    for conv, res in zip(convs, results):
        assert res.tokens == plain.generate(conv, max_new_tokens=24).tokens
        assert res.cached_tokens > 30, "the conversation so far came from the pool"
    cached.forget_prefix()
    assert not cached.batch_target().pool.entries
    assert all(r.cached_tokens == 0 for r in cached.generate(convs, max_new_tokens=4))
