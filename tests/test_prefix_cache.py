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
