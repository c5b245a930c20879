"""Whole layers through the CPU kernels (kernels/layers.py, kernels/model_loop.py): fused projections, RMS norms,
rotary, gated MLPs, lean decoder layers and a batch packed in one forward, each giving the stock forward's bits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drafttree.kernels import fast_linears, gemm, kernel_status, layers, model_loop, small_gemm

ext = small_gemm()
needs_kernel = pytest.mark.skipif(ext is None, reason=f"small-GEMM kernel {kernel_status()}")


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
