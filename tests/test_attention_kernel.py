"""The decode-attention CPU kernel: right against a float64 softmax, row-invariant, blind to masked keys."""

from __future__ import annotations

import pytest
import torch

from drafttree.attention import grouped_attention
from drafttree.cache import cache_arg
from drafttree.kernels import kernel_status, small_gemm, torch_linears

ext = small_gemm()
needs_kernel = pytest.mark.skipif(ext is None, reason=f"small-GEMM kernel {kernel_status()}")
NONE = torch.empty(0, dtype=torch.long)
MIN = torch.finfo(torch.float32).min


def reference(q, k, v, mask, row, node, key_len, scale, groups):
    """softmax(q k^T * scale + mask) v in float64, query by query, over each row's first key_len keys."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for t in range(q.shape[0]):
        b, i, n = int(row[t]), int(node[t]), int(key_len[int(row[t])])
        for h in range(q.shape[1]):
            kv = h // groups
            m = mask[b, 0, i, :n].double()
            s = (k[b, kv, :n].double() @ q[t, h].double()) * scale + m
            s[m <= MIN] = -float("inf")
            out[t, h] = torch.softmax(s, 0) @ v[b, kv, :n].double()
    return out


def packed_case(dtype, D=64, groups=3, kv_heads=3, sizes=(1, 4, 2, 1, 3), seed=0):
    """Rows of different lengths, each with a small tree (a chain and a fork) after its prefix; spare slots filled
    with garbage that the masks exclude."""
    g = torch.Generator().manual_seed(seed)
    B, n = len(sizes), max(sizes)
    lens = torch.randint(5, 40, (B,), generator=g)
    slots = int((lens + n).max()) + 7
    k = torch.randn(B + 2, kv_heads, slots + 9, D, generator=g)[:B, :, :slots].to(dtype)  # strided views, as a cache
    v = torch.randn(B + 2, kv_heads, slots + 9, D, generator=g)[:B, :, :slots].to(dtype)
    mask = torch.full((B, 1, n, slots), MIN)
    for b, m in enumerate(sizes):
        mask[b, 0, :, : lens[b]] = 0
        for i in range(m):
            anc = [0] + ([1] if i >= 2 and i % 2 == 0 else []) + [i]  # node 2 hangs under 1, others under the root
            mask[b, 0, i, [int(lens[b]) + a for a in anc]] = 0
    row = torch.repeat_interleave(torch.arange(B), torch.tensor(sizes))
    node = torch.cat([torch.arange(m) for m in sizes])
    q = torch.randn(len(row), kv_heads * groups, D, generator=g).to(dtype)
    key_len = lens + torch.tensor(sizes)
    return q, k, v, mask.to(dtype), row, node, key_len, D**-0.5, groups


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D,groups,kv_heads", [(64, 3, 3), (128, 2, 2), (12, 1, 2), (40, 4, 1)])
def test_matches_a_float64_softmax(dtype, D, groups, kv_heads):
    q, k, v, mask, row, node, key_len, scale, groups = packed_case(dtype, D, groups, kv_heads)
    got = ext.tree_attention(q, k, v, mask, row, node, key_len, 0, scale)
    ref = reference(q, k, v, mask, row, node, key_len, scale, groups)
    assert got.dtype == dtype and got.shape == q.shape
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_alone_gives_bitwise_what_it_gives_in_a_batch(dtype):
    q, k, v, mask, row, node, key_len, scale, _ = packed_case(dtype)
    together = ext.tree_attention(q, k, v, mask, row, node, key_len, 0, scale)
    for b in range(k.shape[0]):
        sel = row == b
        n = int(key_len[b])
        alone = ext.tree_attention(q[sel].contiguous(), k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                   mask[b:b + 1, :, :, :n].contiguous(), NONE, NONE, NONE, int(sel.sum()), scale)
        assert torch.equal(alone, together[sel])


@needs_kernel
def test_masked_and_out_of_range_keys_are_never_read():
    q, k, v, mask, row, node, key_len, scale, _ = packed_case(torch.float32)
    before = ext.tree_attention(q, k, v, mask, row, node, key_len, 0, scale)
    k2, v2 = k.clone(), v.clone()
    for b in range(k.shape[0]):  # garbage in every slot the masks exclude or beyond each row's keys
        excluded = mask[b, 0].max(0).values <= MIN
        excluded[int(key_len[b]):] = True
        k2[b, :, excluded] = float("nan")
        v2[b, :, excluded] = float("inf")
    assert torch.equal(ext.tree_attention(q, k2, v2, mask, row, node, key_len, 0, scale), before)


@needs_kernel
def test_bad_arguments_raise_one_line_errors():
    q, k, v, mask, row, node, key_len, scale, _ = packed_case(torch.float32)
    with pytest.raises(RuntimeError, match="query out of range"):
        ext.tree_attention(q, k, v, mask, row + 10, node, key_len, 0, scale)
    with pytest.raises(RuntimeError, match="key_len"):
        ext.tree_attention(q, k, v, mask, row, node, key_len + 1000, 0, scale)
    with pytest.raises(RuntimeError, match="share a dtype"):
        ext.tree_attention(q.double(), k, v, mask, row, node, key_len, 0, scale)


@needs_kernel
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_tree_forward_with_the_kernel_matches_torch_attention(arch, monkeypatch):
    """A stock model's tree forward (4-D mask, grouped heads; gemma3: sliding window) through the kernel gives
    torch's attention's logits."""
    from conftest import tiny_causal_lm

    from drafttree import attention
    from drafttree.target import tree_attention_mask

    calls = []

    class Counting:
        def tree_attention(self, *args):
            calls.append(args[0].shape)
            return ext.tree_attention(*args)

    real = attention.kernel_for
    monkeypatch.setattr(attention, "kernel_for", lambda d, t: None if real(d, t) is None else Counting())

    model = tiny_causal_lm(arch)
    ids = torch.randint(2, 60, (1, 20))
    parents = [-1, 0, 0, 1, 2, 3]
    n = len(parents)
    attend = torch.zeros(n, n, dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i, p in enumerate(parents):
        if p >= 0:
            attend[i] = attend[p]
            depth[i] = depth[p] + 1
        attend[i, i] = True
    ids_tree = torch.randint(2, 60, (1, n))
    mask = tree_attention_mask(attend, ids.shape[1], torch.float32)
    pos = (ids.shape[1] + depth)[None]

    def logits(use_kernel: bool):
        with torch.inference_mode():
            past = model(ids, use_cache=True).past_key_values
            kw = {cache_arg(model): past}  # the name this transformers version's forward takes
            with grouped_attention(model):
                if use_kernel:
                    return model(ids_tree, attention_mask=mask, position_ids=pos, **kw).logits
                with torch_linears():
                    return model(ids_tree, attention_mask=mask, position_ids=pos, **kw).logits

    with_kernel = logits(True)
    assert len(calls) == model.config.num_hidden_layers  # every layer's attention went through the kernel
    torch.testing.assert_close(with_kernel, logits(False), rtol=1e-5, atol=1e-5)
    assert len(calls) == model.config.num_hidden_layers


# ------------------------------------------------------------------------------------ prompt (prefill) attention

needs_prompt_kernel = pytest.mark.skipif(ext is None or not getattr(ext, "prompt_attention_ready", False),
                                         reason="no AVX-512 bf16 prompt-attention kernel in this build")


def causal_reference(q, k, v, scale):
    """softmax(q k^T * scale) v in float64, causal, grouped heads: q [T, H, D], k and v [Hkv, T, D]."""
    T, H, _ = q.shape
    groups = H // k.shape[0]
    kk, vv = k.double().repeat_interleave(groups, 0), v.double().repeat_interleave(groups, 0)
    s = torch.einsum("thd,hsd->hts", q.double(), kk) * scale
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hts,hsd->thd", s.softmax(-1), vv)


@needs_prompt_kernel
@pytest.mark.parametrize("T,heads,kv_heads,D", [(1, 9, 3, 64), (17, 9, 3, 64), (64, 4, 4, 32), (65, 9, 3, 64),
                                                (200, 8, 2, 128), (300, 9, 3, 64)])
def test_prompt_attention_is_as_close_to_float64_as_torchs(T, heads, kv_heads, D):
    """Causal, grouped heads, blocks of queries and keys cut anywhere; its error is torch's flash kernel's (both
    round the output to bf16; the kernel also rounds the probabilities)."""
    g = torch.Generator().manual_seed(T)
    q = torch.randn(T, heads, D, generator=g).bfloat16()
    cache = torch.randn(2, kv_heads, T + 50, D, generator=g).bfloat16() * 2  # keys/values as a cache's first slots
    k, v = cache[0, :, :T], cache[1, :, :T]
    scale = D**-0.5
    want = causal_reference(q, k, v, scale)
    got = ext.prompt_attention(q, k, v, scale).double()
    torch_out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k[None], v[None], is_causal=True, scale=scale, enable_gqa=True)[0].transpose(0, 1)
    err, torch_err = (got - want).abs().max().item(), (torch_out.double() - want).abs().max().item()
    assert err <= 2 * torch_err + 1e-3, (err, torch_err)


@needs_prompt_kernel
@pytest.mark.parametrize("L,T", [(130, 1), (130, 57), (300, 200), (97, 96), (64, 64)])
def test_the_rest_of_a_prompt_gets_the_bits_of_a_prefill_of_the_whole(L, T):
    """Queries that are the last T of L positions (a prompt's rest after a cached prefix): each gets exactly what a
    prefill of all L positions gives it, and that is float64's causal attention within bf16's error."""
    g = torch.Generator().manual_seed(L + T)
    q = torch.randn(L, 9, 64, generator=g).bfloat16()
    k, v = torch.randn(2, 3, L, 64, generator=g).bfloat16()
    whole = ext.prompt_attention(q, k, v, 0.125)
    rest = ext.prompt_attention(q[L - T:].contiguous(), k, v, 0.125)
    assert torch.equal(rest, whole[L - T:])
    assert (rest.double() - causal_reference(q, k, v, 0.125)[L - T:]).abs().max() < 0.05
    with pytest.raises(RuntimeError, match="prompt_attention"):
        ext.prompt_attention(q, k[:, : L - 1], v[:, : L - 1], 0.125)  # fewer keys than queries


@needs_prompt_kernel
def test_prompt_attention_never_reads_the_future_and_rows_are_independent():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(130, 9, 64, generator=g).bfloat16()
    k, v = torch.randn(2, 3, 130, 64, generator=g).bfloat16()
    base = ext.prompt_attention(q, k, v, 0.125)
    k2, v2, q2 = k.clone(), v.clone(), q.clone()
    k2[:, 100:] = 1e4  # later keys, values and queries changed: earlier outputs keep their bits
    v2[:, 100:] = -7
    q2[100:] = 3
    assert torch.equal(ext.prompt_attention(q2, k2, v2, 0.125)[:100], base[:100])
    assert torch.equal(ext.prompt_attention(q[:77].contiguous(), k[:, :77], v[:, :77], 0.125), base[:77])
    with pytest.raises(RuntimeError, match="prompt_attention"):
        ext.prompt_attention(q.float(), k, v, 0.125)


@needs_prompt_kernel
def test_a_prompt_prefilled_alone_or_packed_with_others_gets_the_same_bits():
    """bf16 prefill of the default model through the kernel: a prompt alone and the same prompt packed with others
    (batching) give the same logits, and the kernel is what ran. (Shorter prompts:
    test_a_short_prompt_gets_the_same_bits_alone_as_packed_in_bf16_when_asked.)"""
    from drafttree import attention
    from drafttree.batching import BatchTarget
    from drafttree.models import load_model

    model = load_model("smollm2-135m-instruct", dtype="bfloat16", device="cpu", show_progress=False).model
    calls = []
    real = ext.prompt_attention

    class Counting:
        prompt_attention_ready = True

        def prompt_attention(self, *args):
            calls.append(args[0].shape[0])
            return real(*args)

    orig = attention.kernel_for
    attention.kernel_for = lambda d, t: None if orig(d, t) is None else Counting()
    try:
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(100, 40000, (n,), generator=g) for n in (150, 70, 300)]
        bt = BatchTarget(model)
        packed = bt.add_many(prompts, [4, 4, 4])
        assert sorted(set(calls)) == [70, 150, 300]
        for p, out in zip(prompts, packed):
            alone = BatchTarget(model).add_many([p], [4])[0]
            assert torch.equal(alone.logits, out.logits)
    finally:
        attention.kernel_for = orig


def test_a_short_prompt_gets_the_same_bits_alone_as_packed_in_bf16_when_asked():
    """A prompt of 64 tokens or fewer prefilled alone takes the small-GEMM kernel (one fused call per layer); packed
    with others its rows take the many-row path, and bf16 logits differ (by up to 0.7 here): a server's greedy answer
    can depend on what else it is serving. With ``batch_invariant`` (``serve --batch-invariant``,
    $DRAFTTREE_BATCH_INVARIANT) a packed prefill gives short prompts' rows to the kernel (gemm.kernel_rows):
    alone and packed agree bit for bit, and so do the tokens generated, in a batch and alone (decode.py)."""
    import drafttree
    from drafttree.batching import BatchTarget

    sm = drafttree.load("smollm2-135m-instruct", dtype="bfloat16", device="cpu", show_progress=False)
    model = sm.target.model
    g = torch.Generator().manual_seed(3)
    long = torch.randint(100, 40000, (200,), generator=g)
    for n in (1, 2, 9, 40, 64, 65):
        p = torch.randint(100, 40000, (n,), generator=g)
        alone = BatchTarget(model, batch_invariant=True).add_many([p], [4])[0]
        packed = BatchTarget(model, batch_invariant=True).add_many([long, p, long[:30]], [4, 4, 4])[1]
        assert torch.equal(alone.logits, packed.logits), n
    sm.batch_target().batch_invariant = True
    prompts = ["Name a fruit.", "Summarise: " + "The river rose after three days of rain and the bridge closed. " * 12]
    kw = dict(max_new_tokens=24, method="auto")
    together = sm.generate(prompts, **kw)
    for p, got in zip(prompts, together):
        assert sm.generate([p], **kw)[0].tokens == got.tokens
        assert sm.generate(p, **kw).tokens == got.tokens


def test_a_batch_of_many_rows_decodes_each_row_as_alone_in_bf16_when_asked():
    """With ``batch_invariant``, rounds of more than 64 tokens (here 24 rows of 8-node trees) take the small-GEMM
    kernel 64 rows at a time, as each row's tree does alone: every row's greedy text is its text decoded alone, in
    bf16."""
    import drafttree

    sm = drafttree.load("smollm2-135m-instruct", dtype="bfloat16", device="cpu", show_progress=False)
    sm.batch_target().batch_invariant = True
    prompts = [f"Write one sentence about the number {i}." for i in range(24)]
    kw = dict(max_new_tokens=16, method="eagle2", method_options={"total_tokens": 8})  # 24 rows x 8 nodes a round
    together = sm.generate(prompts, **kw)
    assert all(max(r.stats.tree_sizes) == 8 for r in together)
    for p, got in zip(prompts, together):
        assert sm.generate(p, **kw).tokens == got.tokens, p


@needs_prompt_kernel
def test_a_shared_prefix_computed_once_gives_the_bits_of_every_prompt_computed_whole():
    """bf16, the default model: prompts under one chat template packed together compute the system prompt once (the
    rests attend over the copied states through the prompt kernel, as the rest of a cached prompt does) and get the
    bits of the same packed prefill with every prompt computed whole; batch-invariant, the bits of each alone."""
    import drafttree
    from drafttree.batching import BatchTarget

    sm = drafttree.load("smollm2-135m-instruct", dtype="bfloat16", device="cpu", show_progress=False)
    texts = ["Name a fruit.", "Name a fruit and a colour.", "Summarise: " + "The river rose after the rain. " * 20,
             "Name a fruit."]
    ids = [sm.encode_prompt(t) for t in texts]
    for invariant in (False, True):
        shared, whole = BatchTarget(sm.target.model, batch_invariant=invariant), BatchTarget(
            sm.target.model, batch_invariant=invariant)
        whole.share_at_least = 0
        got, ref = shared.add_many(ids, [4] * len(ids)), whole.add_many(ids, [4] * len(ids))
        # batch-invariant, the long prompt's products go another way than the short ones': it shares with none
        assert (shared.last_shared[2] == 0) == invariant and whole.last_shared == [0] * len(ids)
        assert min(shared.last_shared[1], shared.last_shared[3]) >= 20
        for a, b in zip(got, ref):
            assert torch.equal(a.logits, b.logits) and torch.equal(a.features, b.features)
    for x, out in zip(ids, got):  # batch-invariant: as alone
        assert torch.equal(BatchTarget(sm.target.model, batch_invariant=True).add_many([x], [4])[0].logits, out.logits)
