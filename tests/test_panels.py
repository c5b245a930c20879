"""bf16 products on AVX2 panels (kernels/panel_gemm.cpp): right, row-invariant at every row count (tile shapes of 1-6
rows and 1-4 panels), several weights in one call, repacked when a weight changes, and switched on only where they
belong. The panels build on any AVX2 CPU: where they are off by default (AVX-512, no AMX) the tests switch them on."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drafttree.kernels import MAX_ROWS, gemm, kernel_status, small_gemm

ext = small_gemm()
needs_panels = pytest.mark.skipif(ext is None or not ext.panels_ready or gemm.amx_on(),
                                  reason=f"no AVX2 panels here (kernel {kernel_status()}, AMX on: {gemm.amx_on()})")


@pytest.fixture
def panels():
    before = ext.panels_on()
    assert ext.set_panels(True)
    yield
    ext.set_panels(before)


def _weights(n: int, k: int, seed: int, bias: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
    return w, (torch.randn(n, generator=g).bfloat16() if bias else None)


@needs_panels
@pytest.mark.parametrize("n,k", [(48, 96), (64, 576), (16, 7), (80, 33)])  # K needs no multiple; 80: 5 panels
def test_products_match_a_float64_reference(panels, n, k):
    w, b = _weights(n, k, seed=n + k)
    assert ext.packable(w)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(1)).bfloat16()
    ref = F.linear(x.double(), w.double(), b.double())
    for m in (1, 2, 5, 37):  # one-row tiles of 4 panels, two-row tiles of 2, then tiles of up to 6 rows
        got = ext.linear(x[:m], w, b)
        assert got.dtype == torch.bfloat16 and got.shape == (m, n)
        torch.testing.assert_close(got.float(), ref[:m].float().bfloat16().float(), rtol=1 / 128, atol=1e-2)


@needs_panels
def test_a_row_gives_the_same_bits_whatever_rows_are_computed_with_it(panels):
    """Every output sums K in order whatever the tile: a tree or a batch gives bitwise what each row alone gives, past
    the vector kernel's row limit too (many_rows_linear: a prompt's products)."""
    w, b = _weights(112, 160, seed=3)  # 7 panels: a one-row tile of 4 and one of 3
    x = torch.randn(MAX_ROWS + 30, 160, generator=torch.Generator().manual_seed(4)).bfloat16()
    alone = torch.cat([ext.linear(x[i:i + 1], w, b) for i in range(x.shape[0])])
    for m in (2, 3, 4, 5, 6, 7, 8, 13, 17, MAX_ROWS):
        assert torch.equal(ext.linear(x[:m], w, b), alone[:m]), m
    with torch.no_grad():
        assert torch.equal(gemm.many_rows_linear(x, w, b), alone)
        assert torch.equal(gemm.linear(x.view(2, -1, 160), w, b).view(-1, 112), alone)


@needs_panels
def test_several_weights_in_one_call_give_each_product_alone(panels):
    ws = [_weights(n, 96, seed=n)[0] for n in (32, 48, 16)]
    ws.append(_weights(40, 96, seed=40)[0])  # not a multiple of 16 columns: the vector path, in the same call
    assert not ext.packable(ws[-1])
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(5)).bfloat16()
    for got, w in zip(ext.linears(x, ws, []), ws, strict=True):
        assert torch.equal(got, ext.linear(x, w))


@needs_panels
def test_a_weight_changed_in_place_is_repacked_and_packed_copies_can_be_forgotten(panels):
    w, _ = _weights(32, 64, seed=7, bias=False)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(6)).bfloat16()
    first = ext.linear(x, w)
    w.mul_(2)  # through the version counter: repacked on next use
    torch.testing.assert_close(ext.linear(x, w).float(), 2 * first.float(), rtol=1 / 64, atol=0)
    w.data.copy_(_weights(32, 64, seed=8, bias=False)[0])  # behind the version counter: forget_packed
    gemm.forget_packed()
    ref = F.linear(x.double(), w.double())
    torch.testing.assert_close(ext.linear(x, w).float(), ref.float().bfloat16().float(), rtol=1 / 128, atol=1e-2)


@needs_panels
def test_a_model_packed_up_front_gives_what_packing_on_first_use_gives(panels):
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 40)).to(torch.bfloat16)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(9)).bfloat16()
    with torch.no_grad():
        lazy = ext.linear(x, model[0].weight, model[0].bias)
        gemm.forget_packed()
        assert gemm.pack_weights(model) == 64 * 48 * 2  # only the packable weight (40 columns are not 16k)
        assert torch.equal(ext.linear(x, model[0].weight, model[0].bias), lazy)


@needs_panels
def test_switched_off_the_vector_path_takes_over_and_the_key_says_which():
    before = ext.panels_on()
    try:
        assert not ext.set_panels(False)
        w, _ = _weights(32, 64, seed=10, bias=False)
        assert not ext.packable(w) and not gemm.packed_on()
        assert not gemm.kernel_key().endswith("-panels")
        assert ext.set_panels(True) and ext.packable(w) and gemm.kernel_key().endswith("-panels")
    finally:
        ext.set_panels(before)


def test_panels_are_on_by_default_only_where_the_vector_path_is_avx2():
    if ext is None:
        pytest.skip(f"kernel {kernel_status()}")
    import os

    switch = os.environ.get("DRAFTTREE_PANELS", "").strip().lower()
    if switch in ("", "auto"):
        assert ext.panels_on() == (ext.panels_ready and ext.lanes == 8 and not gemm.amx_on())
    if gemm.amx_on():
        assert not ext.set_panels(True)  # never beside AMX: one packed backend a process


def test_a_kernel_switch_set_to_a_word_the_extension_does_not_read_is_reported():
    """The extension takes any value it does not know as "default": a typo must get a line, the known words none."""
    quiet = {"DRAFTTREE_PANELS": " Off ", "DRAFTTREE_AMX": "1", "DRAFTTREE_BF16_DOT": "auto", "PATH": "x"}
    assert gemm.switch_problems(quiet) == []
    assert gemm.switch_problems({"DRAFTTREE_PANELS": "", "DRAFTTREE_AMX": "yes"}) == []
    loud = gemm.switch_problems({"DRAFTTREE_PANELS": "flase", "DRAFTTREE_AMX": "2", "DRAFTTREE_BF16_DOT": "on"})
    assert len(loud) == 3
    assert any(p.startswith("DRAFTTREE_PANELS") and "'flase'" in p for p in loud)
    assert any(p.startswith("DRAFTTREE_AMX") and "'2'" in p for p in loud)
    assert all("\n" not in p for p in loud)
