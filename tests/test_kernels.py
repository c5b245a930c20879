"""The small-GEMM CPU kernel: right products, row-invariant, used only inside our own forwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drafttree.kernels import MAX_ROWS, fast_linears, gemm, kernel_status, layers, model_loop, small_gemm
from drafttree.kernels.kept import KeptCopies

ext = small_gemm()
needs_kernel = pytest.mark.skipif(ext is None, reason=f"small-GEMM kernel {kernel_status()}")

SHAPES = [(1, 49, 576), (3, 37, 100), (4, 64, 1536), (16, 37, 576), (16, 19, 33), (MAX_ROWS, 70, 64), (MAX_ROWS, 5, 7),
          (9, 1, 16)]


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


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(24, n, bias=n != 8) for n in (16, 8, 8))


@needs_kernel
def test_layers_sharing_an_input_give_what_each_gives_alone_in_any_order():
    """q/k/v are computed in one call on the first of them; any order, input or repeat still gets its own product."""
    torch.manual_seed(0)
    attn = _Attention()
    names = ("q_proj", "k_proj", "v_proj")
    x, y = torch.randn(3, 24), torch.randn(3, 24)

    def alone(name, inp):
        layer = getattr(attn, name)
        return ext.linear(inp, layer.weight, layer.bias)

    orders = [[("q_proj", x), ("k_proj", x), ("v_proj", x)], [("v_proj", x), ("q_proj", x), ("k_proj", x)],
              [("q_proj", x), ("k_proj", y), ("v_proj", x), ("q_proj", x)], [("k_proj", x), ("k_proj", x)]]
    with torch.no_grad(), fast_linears(attn):
        for order in orders:
            for name, inp in order:
                assert torch.equal(getattr(attn, name)(inp), alone(name, inp)), (order, name)
    assert isinstance(attn.q_proj.forward.args[0], layers.SharedInput)
    import copy
    import pickle

    for again in (pickle.loads(pickle.dumps(attn)), copy.deepcopy(attn)):  # each copy shares its own q/k/v
        assert again.q_proj.forward.args[0] is again.k_proj.forward.args[0] is not attn.q_proj.forward.args[0]
        with torch.no_grad(), fast_linears(again):
            for name in names:
                layer = getattr(again, name)
                assert torch.equal(layer(y), ext.linear(y, layer.weight, layer.bias))
    with torch.no_grad():  # outside the block: torch's own product
        for name in names:
            layer = getattr(attn, name)
            assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


def _rms_reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    normed = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return w.double() * normed.to(x.dtype).double()


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [576, 64, 37])
def test_rms_norm_matches_a_float64_reference_and_is_row_invariant(dtype, hidden):
    g = torch.Generator().manual_seed(hidden)
    x = (torch.randn(2, 9, hidden, generator=g) * 4).to(dtype)
    w = (1 + torch.randn(hidden, generator=g) / 4).to(dtype)
    got = ext.rms_norm(x, w, 1e-5)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 1e-6 if dtype == torch.float32 else 1 / 64  # bf16: the normalised value is rounded twice
    torch.testing.assert_close(got.double(), _rms_reference(x, w, 1e-5), rtol=tol, atol=tol)
    rows = x.reshape(18, hidden)
    assert torch.equal(torch.cat([ext.rms_norm(rows[i:i + 1], w, 1e-5) for i in range(18)]), got.reshape(18, hidden))


def test_llama_norms_take_the_kernel_and_other_norms_keep_their_own_code():
    """A norm goes through the kernel only if it computes what the kernel does (checked on install): Gemma's
    ``1 + weight`` norm keeps its forward; a stock Llama forward gives the same logits either way."""
    if ext is None:
        pytest.skip(f"small-GEMM kernel {kernel_status()}")
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    for p in llama.parameters():  # norms with weights other than ones
        p.data.add_(torch.randn_like(p) * 0.1)
    gemma = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, head_dim=12)).eval()
    ids = torch.randint(0, 64, (1, 7))
    with torch.no_grad():
        ref = llama(ids).logits
        with fast_linears(llama), fast_linears(gemma):
            got = llama(ids).logits
    norms = [m for m in llama.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and all("forward" in m.__dict__ for m in norms)
    assert all("forward" not in m.__dict__ for m in gemma.modules() if type(m).__name__.endswith("RMSNorm"))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_gives_bitwise_what_the_modeling_code_gives(dtype):
    from transformers.models.llama import modeling_llama

    original = getattr(modeling_llama.apply_rotary_pos_emb, "_drafttree_original", modeling_llama.apply_rotary_pos_emb)
    g = torch.Generator().manual_seed(3)
    # the vector path (D / 2 a multiple of the lanes), its scalar tail (D = 40, 6) and a prompt's many tokens (threads);
    # infinities, denormals, signed zeros and overflowing products among the inputs
    special = torch.tensor([float("inf"), -float("inf"), 1e-40, -0.0, 3e38, -3e38, 1e-39, 0.0]).to(dtype)
    for batch, cos_rows, tokens, dim in ((1, 1, 5, 64), (3, 3, 5, 64), (3, 1, 5, 64), (1, 1, 300, 64),
                                         (2, 1, 7, 128), (1, 1, 9, 40), (2, 2, 3, 6)):
        q = torch.randn(batch, tokens, 6, dim, generator=g).to(dtype).transpose(1, 2)  # [B, H, T, D] as attention has
        k = torch.randn(batch, 2, tokens, dim, generator=g).to(dtype)
        k.view(-1)[:8] = special
        q[0, 0, 0, :6] = special[:min(dim, 6)]
        cos, sin = (torch.randn(cos_rows, tokens, dim, generator=g).to(dtype) for _ in range(2))
        for got, ref in zip(ext.rotary(q, k, cos, sin), original(q, k, cos, sin), strict=True):
            assert got.stride() == ref.stride()
            assert torch.equal(got.isnan(), ref.isnan())  # NaN payloads may differ (torch's vector rounding)
            same = ((got == ref) & (torch.signbit(got) == torch.signbit(ref))) | got.isnan()
            assert bool(same.all())


@needs_kernel
def test_the_rotary_wrapper_takes_the_kernel_only_for_the_plain_call():
    """Inside a block, the plain call (and ``unsqueeze_dim=1``) takes the kernel; any other argument, or outside a
    block, the modeling code's own function."""
    calls = []

    def original(q, k, cos, sin, *args, **kwargs):
        calls.append((args, kwargs))
        return q, k

    wrapped = layers._kernel_rotary(original)
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16)
    cos, sin = torch.randn(1, 3, 16), torch.randn(1, 3, 16)
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        wrapped(q, k, cos, sin)  # outside a block
        with fast_linears(model):
            for kw in ({}, {"unsqueeze_dim": 1}):
                wrapped(q, k, cos, sin, **kw)
            for kw in ({"unsqueeze_dim": 2}, {"position_ids": None}, {"unsqueeze_dim": 1, "position_ids": None}):
                wrapped(q, k, cos, sin, **kw)
            wrapped(q, k, cos, sin, None)
    assert calls == [((), {}), ((), {"unsqueeze_dim": 2}), ((), {"position_ids": None}),
                     ((), {"unsqueeze_dim": 1, "position_ids": None}), ((None,), {})]


class _Counting:
    """The extension, counting the calls of each kernel."""

    def __init__(self, inner):
        self.inner, self.calls = inner, {}

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return getattr(self.inner, name)(*args, **kwargs)
        return call


@needs_kernel
def test_a_llama_forward_runs_every_layer_op_through_the_kernels_only_inside_the_block(monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    layers_n = 3
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96,
                                         num_hidden_layers=layers_n, num_attention_heads=4,
                                         num_key_value_heads=2)).eval()
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        ref = model(ids).logits
        with fast_linears(model):
            model(ids)  # installs
        counting = _Counting(gemm._ext)
        monkeypatch.setattr(gemm, "_ext", counting)
        with fast_linears(model):
            got = model(ids).logits
        inside = dict(counting.calls)
        assert torch.allclose(model(ids).logits, ref, rtol=0, atol=0)  # outside: torch's code, bitwise as before
    assert counting.calls == inside
    # per layer: q/k/v in one call, the MLP in one; o and the LM head alone; two norms and one rotary
    assert inside == {"linears": layers_n, "gated_mlp": layers_n, "linear": layers_n + 1,
                      "rms_norm": 2 * layers_n + 1, "rotary": layers_n}, inside
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


class _Mlp(torch.nn.Module):
    """A Llama-style MLP with the activation given (only SiLU's may be fused)."""

    def __init__(self, act: torch.nn.Module, bias: bool = False):
        super().__init__()
        # 96 wide: torch's elementwise ops take a scalar tail past a multiple of 32 values (another exp), so an
        # activation whose width is not one is not row-invariant in float32, fused or not
        self.gate_proj, self.up_proj = torch.nn.Linear(40, 96, bias=bias), torch.nn.Linear(40, 96, bias=bias)
        self.down_proj, self.act_fn = torch.nn.Linear(96, 40, bias=bias), act

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_a_gated_mlp_in_one_call_gives_the_bits_of_its_forward_through_the_kernels(dtype, bias):
    """The fused MLP is the module's own forward with the kernel's linear layers, bit for bit, and row-invariant;
    an MLP with another activation keeps its own forward."""
    torch.manual_seed(4)
    mlp, gelu = _Mlp(torch.nn.SiLU(), bias).to(dtype).eval(), _Mlp(torch.nn.GELU(), bias).to(dtype).eval()
    with torch.no_grad():
        with fast_linears(mlp), fast_linears(gelu):
            pass  # installs
        assert "forward" in mlp.__dict__ and "forward" not in gelu.__dict__
        for rows in (1, 3, 17):
            x = torch.randn(1, rows, 40).to(dtype)
            with fast_linears(mlp):
                got = mlp(x)
                # the same module with its forward unfused: q/k/v-style shared gate/up, torch's silu and mul
                ref = type(mlp).forward(mlp, x)
                alone = torch.cat([mlp(x[:, i:i + 1]) for i in range(rows)], dim=1)
            assert torch.equal(got, ref) and torch.equal(alone, got), rows
        outside = mlp(x)  # outside the block: torch's products
        assert torch.equal(outside, type(mlp).forward(mlp, x))


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


def _lean(layer) -> bool:
    return layers._installed(layer, layers._lean_forward) is not None


def count_layer_calls(monkeypatch) -> list:
    """The arguments of every whole-layer kernel call (decode_layer) from now on."""
    calls, ext = [], gemm._ext

    class Counting:
        def __getattr__(self, name):
            return getattr(ext, name)

        def decode_layer(self, *args):
            calls.append(args)
            return ext.decode_layer(*args)

    monkeypatch.setattr(gemm, "_ext", Counting())
    return calls


@needs_kernel
@pytest.mark.parametrize("arch", ["llama", "qwen2", "llama-no-input-norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_decoder_layers_give_the_stock_forward_bits(monkeypatch, arch, dtype):
    """A plain Llama-style layer runs its steps as straight kernel calls inside fast_linears blocks: a prefill and
    a tree give bitwise the logits of the same layers through their module forwards (q/k/v biases too, and a layer
    without its input norm, as an EAGLE-1 head's)."""
    import copy

    from drafttree.target import TargetModel
    from tests.conftest import tiny_causal_lm

    model = tiny_causal_lm(arch.split("-")[0], hidden=64, layers=3, dtype=dtype)
    if arch.endswith("no-input-norm"):
        model.model.layers[1].input_layernorm = torch.nn.Identity()
    stock = copy.deepcopy(model)
    lean, plain = TargetModel(model), TargetModel(stock)
    ids = torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(2))
    a = lean.prefill(ids, logits_for="all")
    assert all(_lean(layer) for layer in model.model.layers)
    monkeypatch.setattr(layers, "_lean_layer", lambda layer: None)
    b = plain.prefill(ids, logits_for="all")
    assert not any(_lean(layer) for layer in stock.model.layers)
    assert torch.equal(a.logits, b.logits)
    tokens, depths = torch.tensor([5, 6, 7, 8]), torch.tensor([0, 1, 1, 2])
    anc = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert model_loop.loop_applies(model)  # (its check's forwards run now, not among those counted)
    calls = count_layer_calls(monkeypatch)  # a tree forward: each layer one call (the prefill filled an empty cache)
    assert torch.equal(lean.forward_tree(tokens, depths, anc).logits, plain.forward_tree(tokens, depths, anc).logits)
    assert len(calls) == 3
    lean.commit([0, 1])
    plain.commit([0, 1])
    for cache_layer in lean.cache.layers:  # a full buffer: this forward takes the steps from Python, which grow it
        cache_layer._k, cache_layer._v = (t[..., : cache_layer._len, :].clone() for t in (cache_layer._k,
                                                                                           cache_layer._v))
    calls.clear()
    step = (torch.tensor([9]), torch.tensor([0]), torch.ones(1, 1, dtype=torch.bool))
    assert torch.equal(lean.forward_tree(*step).logits, plain.forward_tree(*step).logits)
    assert not calls
    with torch.no_grad():  # outside the block the stock forward runs: torch's kernels, as before
        assert torch.equal(model(ids[None]).logits, stock(ids[None]).logits)


def test_the_model_loop_is_used_only_where_it_gives_the_stock_bits():
    """A model whose own forward does one more step (here: embeddings scaled, as Gemma's are) fails the loop's check
    and keeps its forward: its tree logits are the stock forward's."""
    import copy

    from transformers.models.llama.modeling_llama import LlamaModel

    from drafttree.target import TargetModel
    from tests.conftest import tiny_causal_lm

    class Scaled(LlamaModel):
        def forward(self, input_ids=None, inputs_embeds=None, cache=None, **kw):
            return super().forward(inputs_embeds=self.embed_tokens(input_ids) * 2, cache=cache, **kw)

    model = tiny_causal_lm("llama", hidden=64, layers=2, dtype=torch.bfloat16)
    model.model.__class__ = Scaled
    stock = copy.deepcopy(model)
    ids = torch.randint(0, 64, (6,), generator=torch.Generator().manual_seed(3))
    tokens, depths = torch.tensor([5, 6, 7]), torch.tensor([0, 1, 1])
    anc = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    got = TargetModel(model)
    got.prefill(ids)
    out = got.forward_tree(tokens, depths, anc).logits
    assert not model_loop.loop_applies(model)
    with torch.inference_mode():
        want = stock(torch.cat([ids, tokens])[None]).logits[0, -3:]  # torch's kernels: close, not the same bits
    assert torch.allclose(out[:2].float(), want[:2].float(), atol=0.1, rtol=0.05)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_batch_packed_in_one_forward_runs_each_layer_as_one_call_with_the_module_paths_bits(monkeypatch, dtype):
    """A batch's rows packed in one sequence (states scattered into their rows, attention over each row's own
    slots) run each lean layer as one decode_layer call: every round's logits and the cache's keys equal, bit for
    bit, those of the same layers through their module forwards, over rounds with rows of different lengths."""
    import copy

    from drafttree.batching import BatchTarget
    from tests.conftest import tiny_causal_lm
    from tests.test_target import _random_tree

    model = tiny_causal_lm("qwen2", vocab=50, hidden=64, layers=2, dtype=dtype, seed=3)
    stock = copy.deepcopy(model)
    lean, plain = BatchTarget(model), BatchTarget(stock)
    g = torch.Generator().manual_seed(1)
    texts = [torch.randint(2, 50, (n,), generator=g) for n in (13, 4, 9)]
    for ids in texts:
        lean.add(ids)
    assert all(_lean(layer) for layer in model.model.layers)
    real = layers._lean_layer
    monkeypatch.setattr(layers, "_lean_layer", lambda layer: None)
    for ids in texts:
        plain.add(ids)
    monkeypatch.setattr(layers, "_lean_layer", real)
    assert model_loop.loop_applies(model)
    calls = count_layer_calls(monkeypatch)
    for rnd in range(3):
        trees = [_random_tree(size, 50, seed=10 * rnd + r) for r, size in enumerate((6, 1, 9))]
        a, b = lean.forward_trees(trees), plain.forward_trees(trees)
        assert all(torch.equal(x.logits, y.logits) for x, y in zip(a, b, strict=True))
        for x, y in zip(lean.cache.layers, plain.cache.layers, strict=True):
            assert torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)
        paths = [tree.path_to(int(tree.depths.argmax())) for tree in trees]
        lean.commit(paths)
        plain.commit(paths)
    assert len(calls) == 6


@needs_kernel
def test_layers_with_other_parts_or_another_forward_keep_their_own():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from drafttree.target import TargetModel
    from tests.conftest import tiny_causal_lm

    class Doubled(LlamaDecoderLayer):  # the same parts, another computation: the bitwise check refuses it
        def forward(self, hidden_states, cache=None, **kwargs):
            return 2 * super().forward(hidden_states, cache=cache, **kwargs)

    model = tiny_causal_lm("llama", hidden=64, layers=2)
    model.model.layers[1].__class__ = Doubled
    TargetModel(model).prefill(torch.arange(5))
    assert _lean(model.model.layers[0]) and not _lean(model.model.layers[1])
    gemma = tiny_causal_lm("gemma3", hidden=64, layers=2)  # four norms per layer (and q/k norms)
    TargetModel(gemma).prefill(torch.arange(5))
    assert not any(_lean(layer) for layer in gemma.model.layers)


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
