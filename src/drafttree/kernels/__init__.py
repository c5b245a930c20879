"""Hand-written CPU kernels for the shapes decoding uses (built on first use, torch as the fallback)."""

from drafttree.kernels.gemm import (
    MAX_ROWS,
    clear_wide_cache,
    kernel_key,
    kernel_status,
    kernels_in_use,
    linear,
    small_gemm,
    wide_bf16_products,
)
from drafttree.kernels.layers import fast_linears, torch_linears

__all__ = ["MAX_ROWS", "clear_wide_cache", "fast_linears", "kernel_key", "kernel_status", "kernels_in_use", "linear",
           "small_gemm", "torch_linears", "wide_bf16_products"]
