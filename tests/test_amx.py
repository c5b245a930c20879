"""bf16 products on AMX tiles (kernels/amx_gemm.cpp): right, row-invariant at every row count, repacked when a weight
changes. Runs where this CPU has AMX (Sapphire Rapids and later Xeons); elsewhere the vector path's tests cover bf16."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from drafttree.kernels import MAX_ROWS, fast_linears, gemm, kernel_status, small_gemm

ext = small_gemm()
needs_amx = pytest.mark.skipif(ext is None or not gemm.amx_on(),
                               reason=f"no AMX tiles here (kernel {kernel_status()})")


def _weights(n: int, k: int, seed: int, bias: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
    return w, (torch.randn(n, generator=g).bfloat16() if bias else None)


@needs_amx
@pytest.mark.parametrize("n,k", [(48, 96), (64, 576), (16, 32)])  # 48: an odd number of 16-column blocks
def test_products_match_a_float64_reference(n, k):
    w, b = _weights(n, k, seed=n + k)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(1)).bfloat16()
    ref = F.linear(x.double(), w.double(), b.double())
    got = ext.linear(x, w, b)
    assert got.dtype == torch.bfloat16 and got.shape == (37, n)
    torch.testing.assert_close(got.float(), ref.float().bfloat16().float(), rtol=1 / 128, atol=1e-2)


@needs_amx
def test_a_row_gives_the_same_bits_whatever_rows_are_computed_with_it():
    """One tile row's sums do not depend on the other rows, nor on how many rows the tiles hold (exactly M up to 16,
    whole tiles of 16 above): a tree or a batch gives bitwise what each row alone gives, past the vector kernel's
    row limit too (many_rows_linear: a prompt's products)."""
    w, b = _weights(80, 160, seed=3)
    x = torch.randn(MAX_ROWS + 30, 160, generator=torch.Generator().manual_seed(4)).bfloat16()
    alone = torch.cat([ext.linear(x[i:i + 1], w, b) for i in range(x.shape[0])])
    for m in (2, 3, 15, 16, 17, 31, 32, 33, 47, MAX_ROWS):
        assert torch.equal(ext.linear(x[:m], w, b), alone[:m]), m
    with torch.no_grad():
        assert torch.equal(gemm.many_rows_linear(x, w, b), alone)
        assert torch.equal(gemm.linear(x.view(2, -1, 160), w, b).view(-1, 80), alone)


@needs_amx
def test_several_weights_in_one_call_give_each_product_alone():
    ws = [_weights(n, 96, seed=n)[0] for n in (32, 48, 16)]
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(5)).bfloat16()
    for got, w in zip(ext.linears(x, ws, []), ws, strict=True):
        assert torch.equal(got, ext.linear(x, w))


@needs_amx
def test_a_weight_changed_in_place_or_freed_is_packed_again():
    w, _ = _weights(32, 64, seed=6, bias=False)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    before = ext.linear(x, w)
    with torch.no_grad():
        w.mul_(-2)
    assert torch.equal(ext.linear(x, w), ext.linear(x, w.clone()))
    assert not torch.equal(ext.linear(x, w), before)
    for seed in range(8, 12):  # new weights, likely at a freed one's address: never its tiles
        del w
        gc.collect()
        w, _ = _weights(32, 64, seed=seed, bias=False)
        torch.testing.assert_close(ext.linear(x, w).float(), F.linear(x.float(), w.float()).bfloat16().float(),
                                   rtol=1 / 128, atol=1e-2)


@needs_amx
def test_a_models_tiles_are_packed_once_into_one_mapping_with_the_same_bits():
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 40)).to(torch.bfloat16)  # 40: not packable
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(13)).bfloat16()
    with torch.no_grad():
        lazily = ext.linear(x, model[0].weight, model[0].bias)  # packed on first use
        assert gemm.pack_tiles(model) == 64 * 48 * 2  # only the packable weight
        assert torch.equal(ext.linear(x, model[0].weight, model[0].bias), lazily)
        with fast_linears(model):
            inside = model(x)
        ref = F.linear(F.linear(x.double(), model[0].weight.double(), model[0].bias.double()).bfloat16().double(),
                       model[1].weight.double(), model[1].bias.double())
    torch.testing.assert_close(inside.float(), ref.float().bfloat16().float(), rtol=1 / 64, atol=2e-2)


@needs_amx
def test_the_default_model_in_bf16_verifies_a_chain_with_the_logits_of_one_token_steps():
    """What bf16 decoding's identity with plain decoding rests on: a 12-token chain verified in one forward gives, bit
    for bit, the logits of 12 one-token steps (every product on tiles, whatever the row count; the prompt's too)."""
    from drafttree.models import load_model
    from drafttree.target import TargetModel

    lm = load_model("smollm2-135m-instruct", dtype="bfloat16", device="cpu", show_progress=False)
    runner = TargetModel(lm.model)
    g = torch.Generator().manual_seed(14)
    prompt, chain = torch.randint(0, 49152, (90,), generator=g), torch.randint(0, 49152, (12,), generator=g)
    runner.prefill(prompt)
    idx = torch.arange(12)
    tree = runner.forward_tree(chain, idx, idx[:, None] >= idx[None, :]).logits
    steps = []
    for i in range(12):
        steps.append(runner.forward_tree(chain[i:i + 1], idx[:1], torch.ones(1, 1, dtype=torch.bool)).logits)
        runner.commit([0])
    assert torch.equal(tree, torch.cat(steps))
