"""The verify cost of the stock model under ``torch.compile``, next to ours (``drafttree calibrate --compare-compile``).

Issue 13 asked whether compiling the target's forward (inductor, a static KV cache, one graph per tree size) beats
the small-GEMM kernel path. This measures it instead of guessing: a second, untouched copy of the model is compiled
in inductor's default mode with its weights frozen (inductor then packs them for the CPU GEMM library; no CUDA graphs
on a GPU) and timed over the same context and token counts as :meth:`TargetModel.forward_tree`, interleaved, after
its logits were checked against the same copy run uncompiled.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from drafttree.budget import CostModel
from drafttree.errors import DraftTreeError

MAX_SIZES = 8  # one graph per size: dynamo's default recompile limit


def _reset(cache, length: int) -> None:
    """Rewind a static cache to ``length`` tokens (the next forward overwrites the same slots)."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(length)


def _check_rewindable(cache) -> None:
    """Sliding-window layers keep their length as a Python int too (and compile again on every change)."""
    layers = cache.layers
    if any(hasattr(layer, "cumulative_length_int") or not hasattr(layer, "cumulative_length") for layer in layers):
        raise DraftTreeError("--compare-compile times models with full-attention layers only (this one has "
                             "sliding-window layers)")


@torch.inference_mode()
def compiled_vs_ours(runner, stock: torch.nn.Module, context: int = 256, sizes: tuple[int, ...] = (1, 4, 16),
                     reps: int = 7, show_progress: bool = False, mode: str | None = None) -> dict[str, CostModel]:
    """Curves for ``runner`` (our path) and ``stock`` (a separate copy of the same model, never run through our
    kernels) compiled by inductor with frozen weights over a ``StaticCache``; medians of ``reps`` interleaved passes."""
    import torch._inductor.config as inductor_config
    from tqdm.auto import tqdm
    from transformers import StaticCache

    context = min(context, runner.max_positions // 2)
    sizes = tuple(n for n in sizes if context + n < runner.max_positions)
    if not sizes or len(sizes) > MAX_SIZES:
        raise DraftTreeError(f"--compare-compile needs 1 to {MAX_SIZES} token counts below "
                             f"{runner.max_positions - context} (the model's positions less the context)")
    vocab = runner.lm_head.weight.shape[0]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (context,), generator=g)
    tokens = {n: torch.randint(0, vocab, (n,), generator=g).to(runner.device) for n in sizes}
    runner.prefill(prompt)
    cache = StaticCache(config=stock.config, max_cache_len=context + max(sizes))
    stock(input_ids=prompt[None].to(runner.device), cache=cache, use_cache=True)  # prefill: not compiled
    _check_rewindable(cache)
    compiled = torch.compile(stock.forward, dynamic=False, mode=mode)  # "reduce-overhead": CUDA graphs on a GPU

    def ours(n: int) -> None:
        idx = torch.arange(n, device=runner.device)
        runner.forward_tree(tokens[n], idx, idx[:, None] >= idx[None, :])

    def theirs(n: int, fn=compiled) -> torch.Tensor:
        _reset(cache, context)
        return fn(input_ids=tokens[n][None], cache=cache, use_cache=True).logits.clone()  # graphs reuse outputs

    def timed(fn: Callable[[int], None], n: int) -> float:
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
        t0 = time.perf_counter()
        fn(n)
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
        return time.perf_counter() - t0

    with inductor_config.patch(freezing=True):  # compiled on first call: one graph per size
        for n in tqdm(sizes, desc="torch.compile, one graph per size", unit="size", disable=not show_progress,
                      leave=False):
            got, want = theirs(n), theirs(n, stock.forward)
            tol = 1e-3 if got.dtype == torch.float32 else 5e-2
            if not torch.allclose(got.float(), want.float(), rtol=tol, atol=tol * float(want.float().abs().max())):
                raise DraftTreeError(f"the compiled forward's logits over {n} tokens differ from the same model "
                                     "run uncompiled: its timing would mean nothing")
            for _ in range(2):
                theirs(n)
                ours(n)
        times: dict[tuple[str, int], list[float]] = {(k, n): [] for k in ("ours", "compiled") for n in sizes}
        for _ in tqdm(range(reps), desc="interleaved passes", unit="pass", disable=not show_progress, leave=False):
            for n in sizes:
                times["ours", n].append(timed(ours, n))
                times["compiled", n].append(timed(theirs, n))
    runner.discard_pending()
    return {k: CostModel(list(sizes), [statistics.median(times[k, n]) for n in sizes], context)
            for k in ("ours", "compiled")}
