"""Every product of a SmolLM2-135M forward at R rows (the small-GEMM kernel, weights streamed as in decoding), on 1 and
then 2 threads, twice each (stop 56: compute-bound at ~145 GFLOP/s per core at 16-64 rows).
Usage: python logs/s56_products_threads.py"""
import time

import torch

import drafttree
from drafttree.kernels import gemm

sm = drafttree.load(dtype="bfloat16")
ext = gemm.small_gemm()
model = sm.target.model


def products(x: torch.Tensor) -> None:
    for layer in model.model.layers:
        a, mlp = layer.self_attn, layer.mlp
        ext.linears(x, [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], [None] * 3)
        ext.linear(x, a.o_proj.weight)
        ext.gated_mlp(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, [])
    ext.linear(x, model.lm_head.weight)


def median_ms(x: torch.Tensor, n: int = 9) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        products(x)
        times.append(time.perf_counter() - t0)
    return sorted(times)[n // 2] * 1e3


for threads in (1, 2, 1, 2):
    torch.set_num_threads(threads)
    cells = [f"{rows}:{median_ms(torch.randn(rows, 576, dtype=torch.bfloat16)):.1f}" for rows in (1, 4, 16, 64)]
    print("threads", threads, "rows:ms", " ".join(cells), flush=True)
