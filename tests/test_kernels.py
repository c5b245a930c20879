"""The small-GEMM CPU kernel: right products, row-invariant, used only inside our own forwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from drafttree.kernels import MAX_ROWS, fast_linears, gemm, kernel_status, small_gemm

ext = small_gemm()
needs_kernel = pytest.mark.skipif(ext is None, reason=f"small-GEMM kernel {kernel_status()}")

SHAPES = [(1, 49, 576), (3, 37, 100), (4, 64, 1536), (16, 19, 33), (MAX_ROWS, 5, 7), (9, 1, 16)]


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
