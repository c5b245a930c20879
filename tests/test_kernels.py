"""The small-GEMM CPU kernel's products: right, row-invariant, used only inside our own forwards, on the paths a
product takes (a few rows, a prompt's many rows, widened, in chunks, packed once).
Whole layers: test_kernel_layers.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drafttree.kernels import MAX_ROWS, fast_linears, gemm, kernel_status, layers, small_gemm
from drafttree.kernels.kept import KeptCopies

ext = small_gemm()
needs_kernel = pytest.mark.skipif(ext is None, reason=f"small-GEMM kernel {kernel_status()}")

SHAPES = [(1, 49, 576), (3, 37, 100), (4, 64, 1536), (16, 37, 576), (16, 19, 33), (MAX_ROWS, 70, 64), (MAX_ROWS, 5, 7),
          (9, 1, 16),
          (5, 32, 16), (1, 48, 8)]  # inputs narrower than one bf16 step over several weight blocks (Gemma 4's per-layer
# projections): a prefetch share divided by zero steps (SIGFPE) until stop 76


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_products_match_a_float64_reference(dtype, shape):
    m, n, k = shape
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    ref = F.linear(x.double(), w.double(), b.double())
    got = ext.linear(x, w, b)
    assert got.dtype == dtype and got.shape == (m, n)
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), ref, rtol=0, atol=1e-5)
    else:  # one rounding of the float32 sum to bf16, as torch's bf16 linear does
        torch.testing.assert_close(got.float(), ref.float().to(dtype).float(), rtol=1 / 128, atol=1e-2)
    torch.testing.assert_close(ext.linear(x, w), F.linear(x.double(), w.double()).to(dtype), rtol=1e-2, atol=1e-2)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_the_rows_beside_it(dtype):
    """Each output has one summation order: a tree row gives bitwise what the row alone gives."""
    g = torch.Generator().manual_seed(1)
    for k in (200, 203):  # 203: every vector width leaves a scalar tail
        w = torch.randn(70, k, generator=g).to(dtype)
        x = torch.randn(MAX_ROWS, k, generator=g).to(dtype)
        alone = torch.cat([ext.linear(x[i:i + 1], w) for i in range(MAX_ROWS)])
        for m in (2, 3, 4, 5, 6, 7, 8, 13, MAX_ROWS):
            assert torch.equal(ext.linear(x[:m], w), alone[:m]), (k, m)
        assert torch.equal(ext.linear(x.view(4, MAX_ROWS // 4, k), w).view(MAX_ROWS, 70), alone)  # any leading shape


@needs_kernel
def test_bf16_rows_agree_across_the_kernel_paths_at_every_magnitude():
    """Few bf16 rows take FMAs, many take vdpbf16ps where this CPU's matches them bit for bit (``bf16_dot``): values
    from 2^-120 to 2^20, so products underflow to denormals (flushed on both paths) and sums cancel."""
    g = torch.Generator().manual_seed(2)
    for k in (96, 96 + 5):  # without and with a scalar tail
        def spread(rows: int, k: int = k) -> torch.Tensor:
            scale = torch.pow(2.0, torch.randint(-60, 10, (rows, k), generator=g).float())
            return (torch.randn(rows, k, generator=g) * scale).bfloat16()

        x, w = spread(MAX_ROWS), spread(40)
        alone = torch.cat([ext.linear(x[i:i + 1], w) for i in range(MAX_ROWS)])
        for m in (2, 3, 4, 5, 6, 7, 9, 16, MAX_ROWS):
            assert torch.equal(ext.linear(x[:m], w), alone[:m]), (k, m)
        ref = F.linear(x.double(), w.double())
        assert torch.isfinite(alone.float()).all()
        big = ref.abs() > 1e-20  # away from the flushed range, the products are the reference's up to one bf16 rounding
        torch.testing.assert_close(alone.double()[big], ref.to(torch.bfloat16).double()[big], rtol=1 / 64, atol=0)
    assert isinstance(ext.bf16_dot, bool)


_PATH_SCRIPT = """
import sys, torch
from drafttree.kernels import small_gemm
ext = small_gemm()
g = torch.Generator().manual_seed(3)
scale = torch.pow(2.0, torch.randint(-60, 10, (2, 24, 101), generator=g).float())
x, w = (torch.randn(2, 24, 101, generator=g) * scale).bfloat16()
torch.save({"dot": ext.bf16_dot, "y": ext.linear(x[:16], w)}, sys.argv[1])
"""


@needs_kernel
def test_the_dot_and_fma_paths_give_the_same_bits_whichever_this_cpu_prefers(tmp_path):
    """Which path many bf16 rows take is timed when the module loads (vdpbf16ps is 2x the FMAs on a Zen 4, 0.4x on
    an Emerald Rapids Xeon); ``DRAFTTREE_BF16_DOT`` forces it. Both give the same bits, so the choice is speed only."""
    import os
    import subprocess
    import sys

    got = {}
    for flag in ("0", "1"):
        out = tmp_path / f"dot{flag}.pt"
        env = {**os.environ, "DRAFTTREE_BF16_DOT": flag}
        subprocess.run([sys.executable, "-c", _PATH_SCRIPT, str(out)], env=env, check=True, timeout=300)
        got[flag] = torch.load(out)
    assert got["0"]["dot"] is False
    assert got["1"]["dot"] is ext.bf16_dot_exact  # forced on only where the instruction matches the FMAs
    assert torch.equal(got["0"]["y"], got["1"]["y"])


@needs_kernel
def test_only_inside_fast_linears_and_only_where_it_applies():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 10, bias=False))
    x = torch.randn(5, 64)

    def stock(inp):
        return F.linear(F.linear(inp, model[0].weight, model[0].bias), model[1].weight)

    def kernel(inp):
        return ext.linear(ext.linear(inp, model[0].weight, model[0].bias), model[1].weight)

    with torch.no_grad():
        with fast_linears(model):
            inside = model(x)
        outside = model(x)
    assert torch.equal(inside, kernel(x))
    assert torch.equal(outside, stock(x))
    big = torch.randn(MAX_ROWS + 1, 64)  # too many rows: torch's packed GEMM
    with torch.no_grad(), fast_linears(model):
        assert torch.equal(model(big), stock(big))
    with fast_linears(model):  # autograd on: torch's kernel, gradients flow
        out = model(x)
    assert out.requires_grad and torch.equal(out.detach(), stock(x).detach())


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("DRAFTTREE_KERNELS", "0")
    assert gemm._why_not() == "off (DRAFTTREE_KERNELS=0)"


@needs_kernel
def test_empty_inputs_and_a_model_that_still_pickles():
    import pickle

    w = torch.randn(40, 32)
    assert ext.linear(torch.zeros(0, 32), w).shape == (0, 40)
    model = torch.nn.Sequential(torch.nn.Linear(32, 40))
    with torch.no_grad(), fast_linears(model):
        assert model(torch.zeros(0, 32)).shape == (0, 40)
    again = pickle.loads(pickle.dumps(model))
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert torch.equal(again(x), model(x))


@needs_kernel
def test_a_llama_that_ran_with_the_kernels_pickles_and_deep_copies():
    """The rotary kernel replaces the modeling module's ``apply_rotary_pos_emb``; transformers 5.25 rebuilds each
    attention module's copy of that function from the name's type when a model pickles (CI broke on it)."""
    import copy
    import pickle

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval().to(torch.bfloat16)
    ids = torch.randint(0, 64, (1, 7))
    with torch.no_grad(), fast_linears(model):
        ref = model(ids).logits
    for again in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        with torch.no_grad(), fast_linears(again):
            assert torch.equal(again(ids).logits, ref)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_several_products_in_one_call_equal_each_product_alone(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 203, generator=g).to(dtype)
    ws = [torch.randn(n, 203, generator=g).to(dtype) for n in (50, 17, 17)]
    bs = [torch.randn(50, generator=g).to(dtype), None, torch.randn(17, generator=g).to(dtype)]
    outs = ext.linears(x, ws, bs)
    for out, w, b in zip(outs, ws, bs, strict=True):
        assert torch.equal(out, ext.linear(x, w, b))


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_bf16_products_round_their_sums_and_biases_as_torch_does(rows):
    """bf16 outputs are rounded inside the kernel: with a permutation as the weight every sum is one exact product,
    so the outputs must be torch's float32 sum plus bias rounded by torch's own conversion, bit for bit (ties to
    even, the largest and smallest normal values), in every column, for every row and each product of one call;
    a NaN input gives NaN outputs."""
    g = torch.Generator().manual_seed(rows)
    k = 300  # not a multiple of the kernel's vector width: the scalar tail too
    special = torch.tensor([3.3e38, -3.3e38, 1.5e-38, -1.2e-38, 1.0, -1.0])
    x = torch.randn(rows, k, generator=g) * 10.0 ** torch.randint(-3, 4, (rows, k), generator=g)
    x[:, : special.numel()] = special
    x = x.bfloat16()
    ws, bs = [], [None, None]
    for n in (k, 37):
        perm = torch.randperm(k, generator=g)[:n]
        ws.append(torch.zeros(n, k).index_put_((torch.arange(n), perm), torch.ones(n)).bfloat16())
    bs[0] = (torch.randn(k, generator=g) * 2**-7).bfloat16()  # sums of two bf16 values: ties and carries
    bs[0][:6] = torch.tensor([3.3e38, 2**-9, 0.0, 1.2e-38, 2**-8, -(2**-8)]).bfloat16()
    outs = ext.linears(x, ws, bs)
    for out, w, b in zip(outs, ws, bs, strict=True):
        ref = x.float() @ w.float().T
        ref = (ref if b is None else ref + b.float()).to(torch.bfloat16)
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    x[0, 7] = float("nan")
    assert ext.linear(x, ws[0], bs[0])[0].isnan().all()


def test_weights_moved_to_huge_pages_keep_their_values_ties_and_outputs(monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from drafttree.kernels import memory

    torch.manual_seed(2)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=True)).eval().to(torch.bfloat16)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 64, (1, 7))
    with torch.no_grad():
        ref = model(ids).logits
    monkeypatch.setenv("DRAFTTREE_HUGE_PAGES", "0")
    assert memory.move_to_huge_pages(model) == 0  # switched off: nothing moved
    monkeypatch.setenv("DRAFTTREE_HUGE_PAGES", "1")
    if not memory.huge_pages_available():
        pytest.skip("no transparent huge pages here")
    moved = memory.move_to_huge_pages(model)
    params = dict(model.named_parameters())
    assert moved >= sum(p.numel() * p.element_size() for p in params.values())
    assert all(torch.equal(params[n], before[n]) and params[n].is_contiguous() for n in before)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    assert all(p.data_ptr() % memory.ALIGN == 0 for p in params.values())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)
        with fast_linears(model):
            model(ids)  # the kernels read the moved weights
    again = __import__("pickle").loads(__import__("pickle").dumps(model))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, ref)


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
def test_many_row_bf16_products_widened_to_float32_are_the_same_products(monkeypatch, bias):
    """Prefill's many-row bf16 products may run in float32 on the widened values (where that is faster): exact
    products, float32 sums, one rounding, so within a rounding of a float64 reference, chunked or not; only inside
    fast_linears blocks, never under torch_linears or with autograd."""
    monkeypatch.setattr(gemm, "_wide", True)
    monkeypatch.setattr(gemm, "WIDE_MIN_ROWS", MAX_ROWS + 36)  # room for a row count between the two paths
    g = torch.Generator().manual_seed(5)
    rows = gemm.WIDE_MIN_ROWS + 3
    model = torch.nn.Linear(96, 200, bias=bias).to(torch.bfloat16)
    x = torch.randn(2, rows, 96, generator=g).bfloat16()
    ref = F.linear(x.double(), model.weight.double(), None if model.bias is None else model.bias.double())
    with torch.no_grad():
        widened = gemm.many_rows_linear(x, model.weight, model.bias)
        wide_bias = None if model.bias is None else model.bias.float()
        assert torch.equal(widened, F.linear(x.float(), model.weight.float(), wide_bias).bfloat16())
    assert torch.equal(gemm.many_rows_linear(x, model.weight, model.bias), F.linear(x, model.weight, model.bias))
    assert widened.dtype == torch.bfloat16 and widened.shape == (2, rows, 200)
    torch.testing.assert_close(widened.float(), ref.float().bfloat16().float(), rtol=1 / 128, atol=1e-2)
    monkeypatch.setattr(gemm, "WIDE_CHUNK", 96 * 7)  # 7 output rows of the weight at a time
    with torch.no_grad():
        chunked = gemm.many_rows_linear(x, model.weight, model.bias)
        # every output column once, from its own block's float32 product (torch's GEMM may sum a 7-column block in
        # another order than the whole weight: bitwise equal on AVX-512 CPUs, not on an AVX2 Zen 3), one rounding
        blocks = [F.linear(x.float(), model.weight[a:a + 7].float(), None if wide_bias is None else wide_bias[a:a + 7])
                  for a in range(0, 200, 7)]
        assert torch.equal(chunked, torch.cat(blocks, dim=-1).bfloat16())
        torch.testing.assert_close(chunked.float(), ref.float().bfloat16().float(), rtol=1 / 128, atol=1e-2)
    with torch.no_grad():
        with fast_linears(model):
            assert torch.equal(model(x), chunked)  # the block takes the widened (chunked) path
            with layers.torch_linears():
                assert torch.equal(model(x), F.linear(x, model.weight, model.bias))
            few = x[0, : gemm.WIDE_MIN_ROWS - 1]  # fewer rows (over the kernel's limit): torch's bf16 product
            assert torch.equal(model(few), F.linear(few, model.weight, model.bias))
        assert torch.equal(model(x), F.linear(x, model.weight, model.bias))  # outside the block: torch
    monkeypatch.setattr(gemm, "_wide", False)  # where bf16 is fast: torch's product everywhere
    with torch.no_grad(), fast_linears(model):
        assert torch.equal(model(x), F.linear(x, model.weight, model.bias))


@needs_kernel
def test_many_row_bf16_products_in_kernel_chunks_give_each_row_its_bits_alone(monkeypatch):
    """Where the kernel was timed faster for a prompt's products (big weights), it takes them MAX_ROWS rows at a time:
    every row gets the bits it gets alone (as in a decoding step); small weights and torch_linears keep their paths."""
    monkeypatch.setattr(gemm, "_chunked", True)
    monkeypatch.setattr(gemm, "CHUNK_MIN_WEIGHT", 70 * 96)
    g = torch.Generator().manual_seed(6)
    model = torch.nn.Linear(96, 70).to(torch.bfloat16)
    x = torch.randn(2, MAX_ROWS + 37, 96, generator=g).bfloat16()
    w, b = model.weight, model.bias
    with torch.no_grad():
        alone = torch.cat([ext.linear(row[None], w, b) for row in x.reshape(-1, 96)]).view(2, MAX_ROWS + 37, 70)
        assert torch.equal(gemm.many_rows_linear(x, w, b), alone)
        with fast_linears(model):
            assert torch.equal(model(x), alone)
            with layers.torch_linears():
                assert torch.equal(model(x), F.linear(x, w, b))
        monkeypatch.setattr(gemm, "_wide", False)
        monkeypatch.setattr(gemm, "CHUNK_MIN_WEIGHT", 70 * 96 + 1)  # one element short: torch's product
        assert torch.equal(gemm.many_rows_linear(x, w, b), F.linear(x, w, b))


def test_a_bad_chunked_bf16_setting_says_so_and_times_instead(monkeypatch, capsys):
    monkeypatch.setenv("DRAFTTREE_CHUNKED_BF16", "often")
    monkeypatch.setattr(gemm, "_chunked", None)
    monkeypatch.setattr(gemm, "small_gemm", lambda: object())
    monkeypatch.setattr(gemm, "wide_bf16_products", lambda: False)
    monkeypatch.setattr(gemm, "_time_chunked", lambda: False)
    assert gemm.chunked_bf16_products() is False
    assert "DRAFTTREE_CHUNKED_BF16 must be 0, 1 or auto, not 'often'" in capsys.readouterr().err
    monkeypatch.setenv("DRAFTTREE_CHUNKED_BF16", "1")
    monkeypatch.setattr(gemm, "_chunked", None)
    assert gemm.chunked_bf16_products() is True


def test_a_bad_wide_bf16_setting_says_so_and_times_instead(monkeypatch, capsys):
    monkeypatch.setenv("DRAFTTREE_WIDE_BF16", "maybe")
    monkeypatch.setattr(gemm, "_wide", None)
    monkeypatch.setattr(gemm, "_time_wide", lambda: False)
    assert gemm.wide_bf16_products() is False
    assert "DRAFTTREE_WIDE_BF16 must be 0, 1 or auto, not 'maybe'" in capsys.readouterr().err
    monkeypatch.setenv("DRAFTTREE_WIDE_BF16", "1")
    monkeypatch.setattr(gemm, "_wide", None)
    assert gemm.wide_bf16_products() is True


def test_widened_weights_are_kept_until_the_weight_changes_or_goes(monkeypatch):
    """A prompt's widened products reuse the float32 copy of a small weight: the same values as widening anew, redone
    when the weight changes in place or gets new storage, dropped with the weight, and not kept past the limit."""
    monkeypatch.setattr(gemm, "_wide_copies", KeptCopies(gemm.wide_cache_limit))
    monkeypatch.delenv("DRAFTTREE_WIDE_CACHE_MB", raising=False)
    g = torch.Generator().manual_seed(7)
    w = torch.randn(40, 24, generator=g).bfloat16()
    first = gemm.widened_weight(w)
    assert torch.equal(first, w.float()) and gemm.widened_weight(w) is first  # kept
    assert gemm._wide_copies.nbytes == 40 * 24 * 4
    with torch.no_grad():
        w.mul_(2)  # an optimizer step, say: the copy is stale
    again = gemm.widened_weight(w)
    assert again is not first and torch.equal(again, w.float())
    w.data = torch.randn(40, 24, generator=g).bfloat16()  # new storage, same tensor object
    assert torch.equal(gemm.widened_weight(w), w.float())
    assert len(gemm._wide_copies.entries) == 1 and gemm._wide_copies.nbytes == 40 * 24 * 4
    del w, first, again
    import gc

    gc.collect()
    assert gemm._wide_copies.entries == {} and gemm._wide_copies.nbytes == 0  # dropped with its weight
    monkeypatch.setenv("DRAFTTREE_WIDE_CACHE_MB", "0")
    v = torch.randn(8, 8, generator=g).bfloat16()
    assert torch.equal(gemm.widened_weight(v), v.float()) and gemm._wide_copies.entries == {}
    monkeypatch.setenv("DRAFTTREE_WIDE_CACHE_MB", "lots")
    assert gemm.wide_cache_limit() == gemm.WIDE_CACHE_MB << 20
    big = torch.zeros(gemm.CHUNK_MIN_WEIGHT, dtype=torch.bfloat16)  # the kernel's chunks take such weights: not kept
    gemm.widened_weight(big)
    assert gemm._wide_copies.entries == {}
    monkeypatch.setenv("DRAFTTREE_WIDE_CACHE_MB", str(1.5 * 64 * 64 * 4 / (1 << 20)))  # room for one 64 x 64 copy
    a, b = torch.randn(64, 64, generator=g).bfloat16(), torch.randn(64, 64, generator=g).bfloat16()
    kept = gemm.widened_weight(a)
    assert torch.equal(gemm.widened_weight(b), b.float()) and list(gemm._wide_copies.entries) == [id(a)]  # b: no room
    assert gemm.widened_weight(a) is kept
    with torch.no_grad():
        a.data.mul_(3)  # a write the version counter does not see: the kept copy is stale until cleared
    gemm.clear_wide_cache()
    assert gemm._wide_copies.entries == {} and gemm._wide_copies.nbytes == 0
    assert torch.equal(gemm.widened_weight(a), a.float())
    p = torch.nn.Parameter(torch.randn(8, 8, generator=g).bfloat16())  # with autograd on: kept detached
    assert gemm.widened_weight(p).grad_fn is None and id(p) in gemm._wide_copies.entries
    del p
    gc.collect()
    assert list(gemm._wide_copies.entries) == [id(a)]


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    """torch's extension loader waits forever for its lock file: one left by an interrupted build must not hang every
    later process, while a build in progress (a fresh lock) keeps its own."""
    import os
    import time

    from drafttree.kernels.gemm import STALE_LOCK_SECONDS, clear_stale_lock

    lock = tmp_path / "lock"
    lock.touch()
    assert not clear_stale_lock(tmp_path) and lock.exists()
    old = time.time() - STALE_LOCK_SECONDS - 5
    os.utime(lock, (old, old))
    assert clear_stale_lock(tmp_path) and not lock.exists()
    assert not clear_stale_lock(tmp_path)  # no lock: nothing to do


def test_prompt_products_on_weights_packed_once_give_torchs_bits_and_follow_the_weight(monkeypatch):
    """onednn.linear: the bits of F.linear (bf16, 65-300 rows, with and without a bias, 3-D input), one packed copy
    per weight, redone when the weight changes in place, none where the cache's budget is 0."""
    from drafttree.kernels import onednn

    if not onednn.available():
        pytest.skip("no oneDNN in this torch build")
    monkeypatch.setenv("DRAFTTREE_ONEDNN_CACHE_MB", "64")
    onednn.clear()
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 80, generator=g).bfloat16()
    bias = torch.randn(96, generator=g).bfloat16()
    with torch.inference_mode():
        for rows in (65, 128, 300):
            for b in (None, bias):
                x = torch.randn(rows, 80, generator=g).bfloat16()
                out = onednn.linear(x, w, b)
                assert out is not None and torch.equal(out, F.linear(x, w, b))
        x3 = torch.randn(2, 70, 80, generator=g).bfloat16()
        assert torch.equal(onednn.linear(x3, w, None), F.linear(x3, w))
        assert len(onednn._kept.entries) == 1
    with torch.no_grad():
        w.mul_(2)  # a change through the tensor: its version counter moves, the copy is redone
    with torch.inference_mode():
        assert torch.equal(onednn.linear(x3, w, None), F.linear(x3, w))
        monkeypatch.setenv("DRAFTTREE_ONEDNN_CACHE_MB", "0")
        onednn.clear()
        assert onednn.linear(x3, w, None) is None and not onednn._kept.entries
