"""bf16 products on AMX tiles (kernels/amx_gemm.cpp): right, row-invariant at every row count, repacked when a weight
changes. Runs where this CPU has AMX (Sapphire Rapids and later Xeons); elsewhere the vector path's tests cover bf16."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

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
def test_a_group_mixing_weights_with_and_without_tiles_gives_each_products_bits():
    """A weight whose shape the tiles do not take (40 rows) runs on the vector path beside tiled ones, and each
    weight's result is what it gives alone, biases included."""
    ws, bs = zip(*(_weights(n, 96, seed=n) for n in (32, 40, 48)), strict=True)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(5)).bfloat16()
    assert [bool(ext.packable(w)) for w in ws] == [True, False, True]
    for got, w, b in zip(ext.linears(x, list(ws), list(bs)), ws, bs, strict=True):
        assert torch.equal(got, ext.linear(x, w, b))
        torch.testing.assert_close(got.float(), F.linear(x.double(), w.double(), b.double()).bfloat16().float(),
                                   rtol=1 / 128, atol=1e-2)


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x.double(), w.double()).bfloat16()


@needs_amx
def test_a_weight_changed_in_place_or_replaced_at_its_address_is_packed_again():
    w, _ = _weights(32, 64, seed=6, bias=False)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    before = ext.linear(x, w)
    with torch.no_grad():
        w.mul_(-2)  # the version counter moves: repacked
    assert torch.equal(ext.linear(x, w), ext.linear(x, w.clone()))
    assert not torch.equal(ext.linear(x, w), before)
    assert torch.equal(ext.linear(x, w[:16]), ext.linear(x, w.clone()[:16]))  # a view of its first rows: its own tiles
    w.data.copy_(_weights(32, 64, seed=8, bias=False)[0])  # behind the version counter: forget_packed
    gemm.forget_packed()
    torch.testing.assert_close(ext.linear(x, w).float(), _reference(x, w).float(), rtol=1 / 128, atol=1e-2)
    memory = bytearray(32 * 64 * 2)  # new weights (new storages) over the same memory: never the old tiles
    for seed in range(9, 12):
        v = torch.frombuffer(memory, dtype=torch.bfloat16).view(32, 64)
        v.copy_(_weights(32, 64, seed=seed, bias=False)[0])
        assert v.data_ptr() == torch.frombuffer(memory, dtype=torch.bfloat16).data_ptr()
        torch.testing.assert_close(ext.linear(x, v).float(), _reference(x, v).float(), rtol=1 / 128, atol=1e-2)
        del v
        gc.collect()


@needs_amx
def test_a_models_tiles_are_packed_once_into_one_mapping_with_the_same_bits():
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 40)).to(torch.bfloat16)  # 40: not packable
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(13)).bfloat16()
    with torch.no_grad():
        lazily = ext.linear(x, model[0].weight, model[0].bias)  # packed on first use
        assert gemm.pack_weights(model) == 64 * 48 * 2  # only the packable weight
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


@pytest.mark.skipif(ext is None, reason=f"small-GEMM kernel {kernel_status()}")
def test_amx_is_on_where_the_cpu_has_it_and_off_when_switched_off():
    """Where this build and process can use AMX the tiles are on unless switched off, a CPU that lists AMX but cannot
    use it says so (a warning: some kernels refuse the tile state), and DRAFTTREE_AMX=0 (or off), with the AVX2 panels
    off too (test_panels.py), keeps every product on the vector path."""
    import warnings

    switch = os.environ.get("DRAFTTREE_AMX", "1").strip().lower()
    if ext.amx_ready and switch not in ("0", "off", "false", "no"):
        assert gemm.amx_on()
    if {"amx_bf16", "amx_tile"} <= set(gemm._cpu_flags().split()) and not ext.amx_ready:
        warnings.warn("this CPU lists AMX but the kernel's tiles are not usable here (build or permission)",
                      stacklevel=1)
    code = ("import torch; from drafttree.kernels import gemm; e = gemm.small_gemm(); "
            "m = torch.nn.Linear(64, 32).to(torch.bfloat16); "
            "print(e.amx, gemm.amx_on(), gemm.pack_weights(m), gemm.kernel_key().endswith('-amx'))")
    for value in ("0", "off"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "DRAFTTREE_AMX": value, "DRAFTTREE_PANELS": "0"}).stdout.split()
        assert out == ["False", "False", "0", "False"], (value, out)
