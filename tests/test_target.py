"""Tree attention on stock transformers models: a tree forward equals the sequential forward of every path."""

from __future__ import annotations

import os

import pytest
import torch

from drafttree.target import TargetModel
from drafttree.tree import DraftTree
from tests.conftest import tiny_causal_lm

ARCHS = ["llama", "qwen2", "gemma3"]


def _sequential_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def _random_tree(n: int, vocab: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    tokens = torch.randint(2, vocab, (n,), generator=g)
    return DraftTree.from_parents(tokens, torch.tensor(parents))


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_forward_equals_every_path(arch):
    model = tiny_causal_lm(arch, vocab=50, seed=1)
    tm = TargetModel(model)
    prompt = torch.randint(2, 50, (13,), generator=torch.Generator().manual_seed(0))
    tm.prefill(prompt)
    tree = _random_tree(12, 50, seed=3)
    out = tm.forward_tree(tree.tokens, tree.depths, tree.ancestors)
    for node in range(tree.size):
        path = tree.path_to(node)
        ref = _sequential_logits(model, prompt.tolist() + tree.tokens[path].tolist())[-1]
        torch.testing.assert_close(out.logits[node], ref, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_commit_equals_fresh_prefill(arch):
    """After committing an accepted path, the cache continues exactly like a prefill of that text."""
    model = tiny_causal_lm(arch, vocab=50, seed=2)
    tm = TargetModel(model)
    prompt = torch.randint(2, 50, (9,), generator=torch.Generator().manual_seed(4))
    tm.prefill(prompt)
    tree = _random_tree(10, 50, seed=5)
    tm.forward_tree(tree.tokens, tree.depths, tree.ancestors)
    deepest = int(tree.depths.argmax())
    path = tree.path_to(deepest)
    tm.commit(path)
    assert tm.length == prompt.numel() + len(path)
    nxt = torch.tensor([7, 8, 9])
    chain = DraftTree.chain(int(nxt[0]), nxt[1:])
    out = tm.forward_tree(chain.tokens, chain.depths, chain.ancestors)
    ids = prompt.tolist() + tree.tokens[path].tolist() + nxt.tolist()
    ref = _sequential_logits(model, ids)[-3:]
    torch.testing.assert_close(out.logits, ref, atol=2e-4, rtol=1e-4)


def test_crop_and_forward_nodes_incremental():
    """Growing a tree one depth at a time (drafter style) gives the same logits as one tree forward."""
    model = tiny_causal_lm("llama", vocab=40, seed=3)
    tm = TargetModel(model)
    prompt = torch.arange(2, 12)
    tm.prefill(prompt)
    # root r with two children a, b; a has child c
    r, a, b, c = 20, 21, 22, 23
    base = tm.length
    o1 = tm.forward_nodes(torch.tensor([r]), torch.tensor([base]), torch.ones(1, 1, dtype=torch.bool))
    o2 = tm.forward_nodes(torch.tensor([a, b]), torch.tensor([base + 1, base + 1]),
                          torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.bool))
    o3 = tm.forward_nodes(torch.tensor([c]), torch.tensor([base + 2]), torch.tensor([[1, 1, 0, 1]], dtype=torch.bool))
    tree = DraftTree.from_parents(torch.tensor([r, a, b, c]), torch.tensor([-1, 0, 0, 1]))
    whole = tm.forward_tree(tree.tokens, tree.depths, tree.ancestors)
    inc = torch.cat([o1.logits, o2.logits, o3.logits])
    torch.testing.assert_close(inc, whole.logits, atol=2e-5, rtol=1e-5)
    tm.crop(5)
    assert tm.length == 5 and tm.cache.layers[0].keys.shape[2] == 5


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_grouped_tree_attention_reads_kv_in_place_and_matches_stock_sdpa(arch):
    """The folded grouped-query path runs for tree forwards and gives the stock SDPA's logits."""
    from transformers import AttentionInterface

    import drafttree.attention as A
    from drafttree.tree import DraftTree

    m = tiny_causal_lm(arch, layers=3, seed=2)
    tree = DraftTree.from_parents(torch.randint(0, 64, (7,)), torch.tensor([-1, 0, 0, 1, 1, 2, 3]))
    prompt = torch.randint(0, 64, (40,))
    stock = TargetModel(m)
    stock.prefill(prompt)
    stock._run = lambda **kw: (stock.base(**kw), None)  # the stock transformers SDPA path (repeat_kv)
    want = stock.forward_tree(tree.tokens, tree.depths, tree.ancestors)
    folded = []

    def counting(module, q, k, v, mask, **kw):
        folded.append(q.shape[2] > 1 and mask is not None and module.num_key_value_groups > 1)
        return A.grouped_sdpa(module, q, k, v, mask, **kw)

    AttentionInterface.register(A.NAME, counting)
    try:
        tm = TargetModel(m)
        tm.prefill(prompt)
        got = tm.forward_tree(tree.tokens, tree.depths, tree.ancestors)
    finally:
        AttentionInterface.register(A.NAME, A.grouped_sdpa)
    assert folded and all(folded[-3:]), "every layer of the tree forward took the folded path"
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    assert m.config._attn_implementation == "sdpa", "the model's own setting is restored"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("overhead", [0, 60, 10_000])
def test_batched_rows_equal_their_sequential_forwards(arch, overhead):
    """Rows of different lengths verify trees packed in one forward, each written after its own prefix and
    attended in runs of rows (overhead 0: every row its own run; 60: runs of rows with different tree sizes
    on a padded grid; 10k: one run): every node's logits equal the
    sequential forward of its row's text, over rounds with chains, branches and root-only rows committed."""
    from drafttree.batching import BatchTarget

    model = tiny_causal_lm(arch, vocab=50, layers=2, seed=3)
    bt = BatchTarget(model)
    bt.segment_overhead = overhead
    g = torch.Generator().manual_seed(1)
    texts = [torch.randint(2, 50, (n,), generator=g).tolist() for n in (13, 4, 9, 11)]
    for ids in texts:
        bt.add(torch.tensor(ids))
    for rnd in range(3):
        trees = [_random_tree(size, 50, seed=10 * rnd + r) for r, size in enumerate((6, 1, 9, 5))]
        runs = bt._runs([t.size for t in trees])
        assert runs[0].first == 0 and runs[-1].end == 4 and all(a.end == b.first for a, b in zip(runs, runs[1:]))
        assert (len(runs) == 4) == (overhead == 0) and (len(runs) == 1) == (overhead == 10_000)
        outs = bt.forward_trees(trees)
        paths = []
        for r, (tree, out) in enumerate(zip(trees, outs)):
            for node in range(tree.size):
                ref = _sequential_logits(model, texts[r] + tree.tokens[tree.path_to(node)].tolist())[-1]
                torch.testing.assert_close(out.logits[node], ref, atol=2e-4, rtol=1e-4)
            paths.append(tree.path_to(int(tree.depths.argmax())) if r != 2 or rnd else [0])
        bt.commit(paths)
        for r, (tree, path) in enumerate(zip(trees, paths)):
            texts[r] += tree.tokens[path].tolist()
        assert bt.lens == [len(t) for t in texts]


def test_the_cache_goes_under_the_name_the_forward_takes_without_deprecation_warnings():
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns, then goes): each forward gets
    the name its signature has, and a prefill + tree forward of a stock model raises no such warning."""
    import warnings

    from drafttree.cache import cache_arg

    class Old(torch.nn.Module):
        def forward(self, x, past_key_values=None):
            return x

    class New(torch.nn.Module):
        def forward(self, x, cache=None, **kwargs):
            return x

    assert cache_arg(Old()) == "past_key_values" and cache_arg(New()) == "cache"
    runner = TargetModel(tiny_causal_lm("llama", vocab=50, hidden=32, seed=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner.prefill(torch.tensor([1, 2, 3]))
        idx = torch.arange(3)
        runner.forward_tree(torch.tensor([4, 5, 6]), idx, idx[:, None] >= idx[None, :])
    assert not [w for w in caught if "past_key_values" in str(w.message)]


def test_bf16_verify_keeps_the_lm_heads_dtype_and_greedy_choices_equal_the_widened_ones():
    """Greedy acceptance needs each node's argmax, not a float32 copy of [n, V] (issue 13): the verifier returns the
    LM head's bf16 logits, and accepting on them picks exactly what accepting on their float32 widening picks."""
    from drafttree.accept import accept_greedy

    model = tiny_causal_lm("llama", vocab=50, seed=1, dtype=torch.bfloat16)
    tm = TargetModel(model)
    tm.prefill(torch.randint(2, 50, (9,), generator=torch.Generator().manual_seed(0)))
    for seed in range(6):
        tree = _random_tree(10, 50, seed=seed)
        out = tm.forward_tree(tree.tokens, tree.depths, tree.ancestors)
        assert out.logits.dtype == torch.bfloat16
        assert accept_greedy(tree, out.logits) == accept_greedy(tree, out.logits.float())
        best = out.logits.argmax(-1)
        tm.discard_pending()
        # the same shape with every node the argmax at its parent in the random tree: acceptance walks deeper
        guided = DraftTree.from_parents(torch.cat([tree.tokens[:1], best[tree.parents[1:]]]), tree.parents)
        out = tm.forward_tree(guided.tokens, guided.depths, guided.ancestors)
        path, nxt = accept_greedy(guided, out.logits)
        assert len(path) >= 2 and (path, nxt) == accept_greedy(guided, out.logits.float())
        tm.discard_pending()


@pytest.mark.parametrize("order", [[0, 4, 2], [0, 1, 2, 3, 4], [3, 4], [2, 0, 1], [4, 3, 2, 1, 0]])
def test_a_batch_cache_keeps_rows_in_any_order_moving_in_place_only_where_no_row_moves_up(order):
    """Rows kept in the given order equal a gather of them (the decoder fills a finished row's place with a row from
    the end: [0, 4, 2]); where no row moves up the buffer is reused, not copied."""
    from drafttree.cache import GrowingCache, GrowingLayer

    g = torch.Generator().manual_seed(0)
    cache = GrowingCache()
    for r in range(5):
        one = GrowingCache()
        k, v = torch.randn(1, 2, 7 + r, 4, generator=g), torch.randn(1, 2, 7 + r, 4, generator=g)
        one.update(k, v, 0)
        cache.add_row(one)
    layer: GrowingLayer = cache.layers[0]
    before_k, before_v, buf = layer.keys.clone(), layer.values.clone(), layer._k
    cache.select_rows(order)
    assert torch.equal(layer.keys, before_k[order]) and torch.equal(layer.values, before_v[order])
    assert (layer._k is buf) == all(r >= i for i, r in enumerate(order))


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from Linux's /proc")
def test_large_cpu_cache_buffers_are_lazily_mapped_zeros_that_outlive_their_mapping_object():
    """Big CPU buffers come from an anonymous mapping (untouched slots cost nothing); they read as zeros, take
    writes, free their memory with the tensor, and small or non-CPU ones stay ordinary zeros."""
    import gc

    from drafttree.cache import LAZY_BYTES, zeros

    like = torch.empty(0, dtype=torch.bfloat16)
    big = zeros(like, 8, 3, LAZY_BYTES // (8 * 3 * 2) + 64)
    gc.collect()  # only the tensor holds the mapping now
    assert big.dtype == torch.bfloat16 and big.is_contiguous() and not big.any()
    assert big.untyped_storage().nbytes() >= LAZY_BYTES
    big[3, 1, 5:9] = 2.5
    assert big.sum().item() == 2.5 * 4 and big[3, 1, 5].item() == 2.5
    def resident() -> int:  # this process's resident memory, bytes
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = resident()
    huge = zeros(like, 64, 4, 4096, 128)  # 256 MiB
    assert resident() - before < 32 << 20, "allocating maps nothing in"
    huge[:, :, :16] = 1.0  # 1/256 of it touched
    assert resident() - before < 32 << 20
    del huge
    small = zeros(like, 2, 3, 4)
    assert small.shape == (2, 3, 4) and not small.any()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("feature_layers", [None, [0, 1]])
def test_prompts_prefilled_together_equal_each_alone_on_every_architecture(arch, feature_layers):
    """Packed prefills (or, with a sliding window, one at a time) give each prompt its own prefill's logits, features
    (the EAGLE-3 layers' inputs too) and cache row; the rows then verify trees exactly as rows added one by one."""
    from drafttree.batching import BatchTarget

    model = tiny_causal_lm(arch, vocab=50, seed=3)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(2, 50, (n,), generator=g) for n in (5, 17, 9, 30)]
    alone, packed = BatchTarget(model, feature_layers), BatchTarget(model, feature_layers)
    assert packed.packs_prompts() == (arch != "gemma3")  # sliding-window layers: one prompt at a time
    ref = [alone.add(p) for p in prompts]
    got = packed.add_many(prompts, room=[8] * len(prompts))
    assert packed.lens == alone.lens == [p.numel() for p in prompts]
    for a, b in zip(ref, got):
        assert torch.allclose(a.logits, b.logits, atol=1e-5) and torch.allclose(a.features, b.features, atol=1e-5)
    trees = [_random_tree(4, 50, seed=s) for s in range(len(prompts))]
    for a, b in zip(alone.forward_trees(trees), packed.forward_trees(trees)):
        assert torch.allclose(a.logits, b.logits, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prompts_that_begin_alike_compute_their_shared_prefix_once(arch, monkeypatch):
    """A packed prefill computes a prefix that several prompts share (a chat template's system prompt) once and copies
    its states into each row: the forward sees only the rests, and every prompt still gets its own prefill's logits,
    features and cache row. Chains (a prompt sharing more with a prompt that itself shares), a prompt that is another's
    prefix, duplicates, and one too short to share are covered; ``share_at_least = 0`` turns it off."""
    from drafttree.batching import BatchTarget
    from drafttree.batching import target as batch_target

    model = tiny_causal_lm(arch, vocab=50, seed=7)
    g = torch.Generator().manual_seed(8)
    system, a, b = (torch.randint(2, 50, (n,), generator=g) for n in (12, 20, 9))
    prompts = [torch.cat([system, a]), torch.cat([system, b]), torch.cat([system, a[:15], b]), system[:10],
               torch.cat([system, a]), torch.cat([system[:5], b]), b]
    seen = []
    real = batch_target.run_with_features
    monkeypatch.setattr(batch_target, "run_with_features",
                        lambda m, layers, **kw: seen.append(kw["input_ids"].shape[1]) or real(m, layers, **kw))
    alone = BatchTarget(model, [0, 1])
    ref = [alone.add(p) for p in prompts]
    packed = BatchTarget(model, [0, 1])
    got = packed.add_many(prompts, room=[8] * len(prompts))
    # system+a[:15] shares 27 with the first; system[:10] keeps its last token; a duplicate all but its last token
    assert packed.last_shared == [0, 12, 27, 9, 31, 0, 0]
    lens = [p.numel() for p in prompts]
    assert seen[-1] == sum(lens) - sum(packed.last_shared) and packed.lens == lens
    for r, (x, y) in enumerate(zip(ref, got)):
        assert torch.allclose(x.logits, y.logits, atol=1e-5) and torch.allclose(x.features, y.features, atol=1e-5)
        for la, lb in zip(alone.cache.layers, packed.cache.layers):
            assert torch.allclose(la.keys[r, :, :lens[r]], lb.keys[r, :, :lens[r]], atol=1e-5)
            assert torch.allclose(la.values[r, :, :lens[r]], lb.values[r, :, :lens[r]], atol=1e-5)
    trees = [_random_tree(4, 50, seed=s) for s in range(len(prompts))]
    for x, y in zip(alone.forward_trees(trees), packed.forward_trees(trees)):
        assert torch.allclose(x.logits, y.logits, atol=1e-5)
    whole = BatchTarget(model, [0, 1])
    whole.share_at_least = 0
    whole.add_many(prompts, room=[8] * len(prompts))
    assert whole.last_shared == [0] * len(prompts) and seen[-1] == sum(lens)


def test_a_newcomer_takes_a_shared_prefix_from_a_row_still_in_the_batch():
    """A request that joins a running batch (a server's next user under the same system prompt) computes only what
    follows the prefix it shares with a row still decoding, alone or packed with other newcomers; rows that left
    share nothing. Each gets its own prefill's logits and features, and its trees verify as a row added alone."""
    from drafttree.batching import BatchTarget

    model = tiny_causal_lm("llama", vocab=50, seed=9)
    g = torch.Generator().manual_seed(10)
    system, a, b, c = (torch.randint(2, 50, (n,), generator=g) for n in (14, 6, 9, 5))
    first = [torch.cat([system, a]), b]
    alone, batch = BatchTarget(model, [0, 1]), BatchTarget(model, [0, 1])
    for t in (alone, batch):
        t.add_many(first, room=[8, 8])
        t.forward_trees([_random_tree(3, 50, seed=s) for s in (1, 2)])
        t.commit([[0, 1], [0]])
    later = [torch.cat([system, c]), torch.cat([system, a[:3]])]
    ref = [alone.add(x, 8) for x in later[:1]]
    got = batch.add_many(later[:1], room=[8])  # one newcomer: packed with nobody, still shares
    assert batch.last_shared == [14]
    ref += [alone.add(x, 8) for x in later[1:]]
    got += batch.add_many(later[1:], room=[8])
    assert batch.last_shared == [16] and batch.lens == alone.lens  # all of it but its last token
    for x, y in zip(ref, got):
        assert torch.allclose(x.logits, y.logits, atol=1e-5) and torch.allclose(x.features, y.features, atol=1e-5)
    trees = [_random_tree(4, 50, seed=s) for s in range(4)]
    for x, y in zip(alone.forward_trees(trees), batch.forward_trees(trees)):
        assert torch.allclose(x.logits, y.logits, atol=1e-5)
    solo = BatchTarget(model, [0, 1])  # the row shared from was itself prefilled alone
    solo.add_many([torch.cat([system, a])], room=[8])
    assert solo.last_shared == [0]
    out = solo.add_many([torch.cat([system, c])], room=[8])[0]
    assert solo.last_shared == [14] and torch.allclose(out.features, ref[0].features, atol=1e-5)
    batch.keep([1])  # the rows that began with the system prompt leave (row 1 is b)
    batch.add_many([torch.cat([system, b])], room=[8])
    assert batch.last_shared == [0]
    batch.keep([])
    batch.add_many([torch.cat([system, a])], room=[8])
    assert batch.last_shared == [0]


def test_shared_prefixes_pick_the_longest_earlier_match_of_the_same_kind():
    from drafttree.batching.target import shared_prefixes

    ps = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 3, 4, 7], [1, 2, 3, 4, 5], [8, 1, 2]]
    assert shared_prefixes(ps, 3) == [(-1, 0), (0, 3), (0, 4), (0, 4), (-1, 0)]
    assert shared_prefixes(ps, 4) == [(-1, 0), (-1, 0), (0, 4), (0, 4), (-1, 0)]
    assert shared_prefixes(ps, 3, kinds=[0, 1, 1, 0, 0]) == [(-1, 0), (-1, 0), (1, 3), (0, 4), (-1, 0)]


@pytest.mark.parametrize("packed", [True, False])
def test_an_emptied_batch_keeps_its_buffers_and_newcomers_compute_what_a_fresh_batch_does(packed):
    """Once every row has left, the cache's buffers stay (no new zero-filled buffer per burst); rows that join then
    find an earlier row's states past their own length, masked out: their prefill and trees give a fresh batch's
    bits."""
    from drafttree.batching import BatchTarget

    model = tiny_causal_lm("llama", vocab=50, seed=5)
    g = torch.Generator().manual_seed(6)
    first = [torch.randint(2, 50, (n,), generator=g) for n in (40, 31, 12)]
    later = [torch.randint(2, 50, (n,), generator=g) for n in (7, 19)]
    used, fresh = BatchTarget(model), BatchTarget(model)
    used.add_many(first, room=[16] * 3)
    used.forward_trees([_random_tree(5, 50, seed=s) for s in range(3)])
    used.commit([[0, 1], [0], [0, 1, 2]])
    buf = used.cache.layers[0]._k
    used.keep([])
    assert used.rows == 0 and used.cache.layers[0]._k is buf and used._slots() == 0
    add = (lambda t, ps: t.add_many(ps, room=[4] * len(ps))) if packed else (lambda t, ps: [t.add(p, 4) for p in ps])
    for a, b in zip(add(fresh, later), add(used, later)):
        assert torch.equal(a.logits, b.logits) and torch.equal(a.features, b.features)
    assert used.cache.layers[0]._k is buf  # room enough: the same buffer
    trees = [_random_tree(4, 50, seed=s) for s in (7, 8)]
    for a, b in zip(fresh.forward_trees(trees), used.forward_trees(trees)):
        assert torch.equal(a.logits, b.logits)
    used.keep([])
    used.forget_buffers()
    assert used.cache is None
