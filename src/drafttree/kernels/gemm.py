"""Linear layers for the few-row products of decoding, streaming the weights once (``small_gemm.cpp``).

torch's CPU GEMM packs the weight matrix on every call: a product over a handful of rows (a draft tree, a
batch of trees) reads the weights several times, so a 16-token tree costs several one-token steps where the
memory traffic alone would allow ~one. The kernel reads each weight block once for all rows, accumulates in
float32 (the weights' values as stored: float32, or bf16 widened exactly) and is row-invariant.

It is built on first use with torch's ``cpp_extension`` (g++, ``-march=native``) into the drafttree cache and
used only where it applies: CPU with AVX-512 or AVX2 + FMA (the vector width is chosen when it is built),
float32/bf16, no autograd, at most :data:`MAX_ROWS` rows (bf16 products on AMX tiles: any row count, see
``amx_gemm.cpp`` and :func:`many_rows_linear`), and only inside :func:`fast_linears` blocks, so the
same model object runs torch's own kernels everywhere else (e.g. Hugging Face's ``generate``, our ``hf-ar``
baseline). ``DRAFTTREE_KERNELS=0`` turns it off; any build problem is one warning line and torch from then on.
The same extension holds the decode-attention kernel (``tree_attention.cpp``, used by ``attention.py``); both share
the vector backend of ``simd.h``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
import torch.nn.functional as F

from drafttree.kernels import onednn, settings
from drafttree.kernels.kept import KeptCopies
from drafttree.paths import cache_dir

# Above this torch's packed GEMM is as fast or faster (`drafttree calibrate --compare-kernels`, float32). 2-core AMD
# EPYC, AVX2, 4 x 3 tiles: the kernel is faster up to 64 rows (48 rows 122 ms vs 153, 64 rows 155 vs 181 per
# SmolLM2-135M forward). The 2-core Xeon (AVX-512) measured ~48 rows for SmolLM2-135M and ~32 for Qwen2.5-Coder-1.5B
# before the tiles' inner loop was unrolled; not measured there since.
MAX_ROWS = 64
SOURCE = Path(__file__).with_name("small_gemm.cpp")
# the extension: the GEMM (and the module), bf16 products on AMX tiles, decode attention, prompt attention, RMSNorm
# and rotary, a whole decode layer, and the vector backend they share
SOURCES = tuple(SOURCE.with_name(n) for n in ("small_gemm.cpp", "amx_gemm.cpp", "panel_gemm.cpp",
                                              "packed_weights.cpp", "tree_attention.cpp", "prompt_attention.cpp",
                                              "layer_ops.cpp", "decode_layer.cpp", "kernels.h",
                                              "simd.h"))
_DTYPES = (torch.float32, torch.bfloat16)
NO_INDEX = torch.empty(0, dtype=torch.long)  # "not given" for the kernels' optional index tensors

_lock = threading.Lock()


class _Active(threading.local):
    """Per thread: inside how many fast_linears blocks (``depth``) and torch_linears blocks (``off``), and which block.
    Class defaults, so the hot paths read plain attributes (no ``getattr`` with a default per call)."""

    depth = 0
    off = 0
    block = None
    split = None  # (rows, rows for the kernel, other rows) of a packed forward: see kernel_rows


_active = _Active()
_ext = None
_status: str | None = None  # why the kernel is not used, or "on"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _why_not() -> str | None:
    if os.environ.get("DRAFTTREE_KERNELS", "1").strip().lower() in ("0", "off", "false", "no"):
        return "off (DRAFTTREE_KERNELS=0)"
    flags = set(_cpu_flags().split())
    if platform.machine() not in ("x86_64", "AMD64") or not ("avx512f" in flags or {"avx2", "fma"} <= flags):
        return "off (neither AVX-512 nor AVX2 with FMA on this CPU)"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "off (no C++ compiler)"
    return None


_ON_WORDS, _OFF_WORDS = ("1", "on", "true", "yes"), ("0", "off", "false", "no")
# what the extension does with a value it does not know (small_gemm.cpp reads these switches itself)
_SWITCH_FALLBACK = {"DRAFTTREE_PANELS": "panels where the vector path is AVX2, as by default",
                    "DRAFTTREE_AMX": "AMX tiles where the CPU has them, as by default"}


def switch_problems(env: Mapping[str, str]) -> list[str]:
    """One line per kernel switch in ``env`` set to a value the extension does not read (it would silently take the
    default: a typo such as DRAFTTREE_PANELS=flase must not pass unnoticed)."""
    problems = []
    dot = env.get("DRAFTTREE_BF16_DOT")
    if dot is not None and dot not in ("0", "1", "auto", ""):
        problems.append(f"DRAFTTREE_BF16_DOT must be 0, 1 or auto, not {dot!r}; timing both paths instead")
    for name, fallback in _SWITCH_FALLBACK.items():
        value = env.get(name)
        if value is not None and value.strip().lower() not in (*_ON_WORDS, *_OFF_WORDS, ""):
            problems.append(f"{name} must be 0/off/false/no or 1/on/true/yes, not {value!r}; using {fallback}")
    return problems


def small_gemm():
    """The compiled extension (``linear(x, w, bias)``), or None where it cannot be used (see :func:`kernel_status`)."""
    global _ext, _status
    if _status is not None:
        return _ext
    with _lock:
        if _status is not None:
            return _ext
        reason = _why_not()
        for problem in switch_problems(os.environ):
            print(f"drafttree: {problem}", file=sys.stderr)
        if reason is None:
            try:
                _ext = _build()
                reason = "on"
            except Exception as exc:  # a broken toolchain must not stop decoding: torch does the same work
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
                reason = f"off (build failed: {first[:160]})"
                print(f"drafttree: small-GEMM kernel not built, using torch ({first[:160]})", file=sys.stderr)
        _status = reason
    return _ext


STALE_LOCK_SECONDS = 15 * 60  # a build takes ~1-2 min; a lock this old was left by a build that was interrupted


def clear_stale_lock(build: Path, now: float | None = None) -> bool:
    """Remove the build directory's lock file if it is older than STALE_LOCK_SECONDS (torch's extension loader waits
    for it to go, forever: a build interrupted by Ctrl+C or a killed process would hang every later one)."""
    lock = build / "lock"
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except OSError:
        return False
    if age < STALE_LOCK_SECONDS:
        return False
    print(f"drafttree: removing a kernel build lock left {age / 60:.0f} min ago by an interrupted build ({lock})",
          file=sys.stderr)
    lock.unlink(missing_ok=True)
    return True


def _build():
    from torch.utils.cpp_extension import load

    source = b"".join(p.read_bytes() for p in SOURCES)
    # the sources' folder too: two checkouts building one directory would rebuild it in turn (its build file names the
    # sources' paths) and race each other
    key = hashlib.sha256(source + torch.__version__.encode() + _cpu_flags().encode() + sys.version.encode()
                         + str(SOURCE.parent.resolve()).encode())
    build = cache_dir() / "kernels" / key.hexdigest()[:16]
    build.mkdir(parents=True, exist_ok=True)
    clear_stale_lock(build)
    if not any(build.glob("*.so")):
        print("drafttree: building the small-GEMM CPU kernel (once per machine, ~1 min)", file=sys.stderr)
    return load(name="drafttree_small_gemm", sources=[str(p) for p in SOURCES if p.suffix == ".cpp"],
                build_directory=str(build),
                extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)


def kernel_key() -> str:
    """What the kernel in use is (source and row limit), for caches of measured costs; "torch" when it is not."""
    if not kernels_in_use():
        return "torch"
    dot = "-dot" if getattr(_ext, "bf16_dot", False) else ""  # vdpbf16ps tiles where they are faster (timed at load)
    amx = "-amx" if getattr(_ext, "amx", False) else ""  # bf16 products on AMX tiles (amx_gemm.cpp)
    panels = "-panels" if panels_on() else ""  # bf16 products on AVX2 panels (panel_gemm.cpp)
    return f"small-gemm-{MAX_ROWS}-{_source_hash()}-x{getattr(_ext, 'lanes', 0)}{dot}{amx}{panels}"


@functools.cache
def _source_hash() -> str:
    # the Python that routes a forward's steps to the kernels (this file, layers.py) changes the cost of a forward too
    paths = (*SOURCES, Path(__file__), SOURCE.with_name("layers.py"))
    return hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()[:8]


def amx_on() -> bool:
    """Whether bf16 products take AMX tiles here (``amx_gemm.cpp``: CPUs with AMX, unless DRAFTTREE_AMX=0)."""
    return bool(getattr(small_gemm(), "amx", False))


def panels_on() -> bool:
    """Whether bf16 products take AVX2 panels here (``panel_gemm.cpp``: where the vector path is AVX2, unless
    DRAFTTREE_PANELS=0; DRAFTTREE_PANELS=1 asks for them on AVX-512 too; never with AMX)."""
    ext = small_gemm()
    return ext is not None and bool(ext.panels_on())


def packed_on() -> bool:
    """Whether bf16 products take weights repacked once for a backend (AMX tiles or AVX2 panels), at every row count."""
    return amx_on() or panels_on()


def pack_weights(model: torch.nn.Module) -> int:
    """Repack ``model``'s bf16 linear weights for the packed backend on here (AMX tiles, AVX2 panels), all in one
    huge-page mapping (decoding streams them, as it streamed the weights: kernels/memory.py), so the first forward does
    not pack them one by one in 4 KiB pages. The weights stay as they are (torch's own forward reads them), so bf16
    weights take twice their memory. A weight changed in place through its version counter is repacked; writes that
    bypass it (``.data``, numpy) need :func:`forget_packed`. Returns the bytes packed (0: no packed backend here)."""
    from drafttree.kernels.memory import ALIGN, huge_page_bytes

    if not packed_on():
        return 0
    weights = list({id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)
                    and _ext.packable(m.weight)}.values())
    sizes = [-(-w.numel() * 2 // ALIGN) * ALIGN for w in weights]
    raw = huge_page_bytes(sum(sizes)) if weights else None
    offset = 0
    with torch.inference_mode():
        for w, size in zip(weights, sizes, strict=True):
            packed = _ext.pack_weight(w)
            if raw is not None:
                packed = raw[offset:offset + w.numel() * 2].view(torch.bfloat16).copy_(packed)
            offset += size
            _ext.register_packed(w, packed)
    return offset


def forget_packed() -> None:
    """Drop every weight's packed copy (packed again on next use): after writing weights behind torch's back."""
    if small_gemm() is not None:
        _ext.forget_packed()


def kernels_in_use() -> bool:
    """Whether linear layers inside :func:`fast_linears` run the kernel here and now (not under torch_linears)."""
    return small_gemm() is not None and not _active.off


def kernel_status() -> str:
    """"on", or "off (reason)" — builds the kernel if that has not been tried yet."""
    small_gemm()
    return _status or "off"


@contextlib.contextmanager
def kernel_rows(short: torch.Tensor | None, total: int) -> Iterator[None]:
    """Inside the block (a packed forward of ``total`` rows), bf16 products give the rows ``short`` (a prefill's prompts
    of up to MAX_ROWS tokens; every row of a batch's round) to the small-GEMM kernel and the others to the many-row
    path: each prompt and tree then gets the bits it gets alone (up to MAX_ROWS rows take the kernel there, more the
    many-row path; both are row-invariant). Without it a short prompt's logits differed packed and alone (by up to 0.7
    in bf16), and a server's greedy answer could depend on what else it was serving."""
    prev = _active.split
    if short is None or not short.any():
        _active.split = None
    else:
        _active.split = (total, short.nonzero().flatten(), (~short).nonzero().flatten())
    try:
        yield
    finally:
        _active.split = prev


def _split_rows(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """A packed forward's product, the rows kernel_rows names on the kernel, the others on the many-row path;
    None: not such a product."""
    total, short, other = _active.split
    if (x.dim() < 2 or x.numel() != total * x.shape[-1] or w.dim() != 2 or not w.is_contiguous()
            or x.shape[-1] != w.shape[1] or small_gemm() is None):
        return None
    x2 = x.reshape(total, -1)
    if not other.numel():  # every row on the kernel (a round of small trees): no rows to gather
        return _kernel_chunks(x, w, bias)
    out = x2.new_empty((total, w.shape[0]))
    out.index_copy_(0, short, _kernel_chunks(x2.index_select(0, short), w, bias))
    if other.numel():
        split, _active.split = _active.split, None  # the other prompts' rows: the path they take alone (many rows)
        try:
            out.index_copy_(0, other, many_rows_linear(x2.index_select(0, other), w, bias))
        finally:
            _active.split = split
    return out.view(*x.shape[:-1], w.shape[0])


def _applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    # called for every linear layer of every forward: the cheapest checks (is_cpu, not device.type) come first
    return (_ext is not None and x.is_cpu and w.is_cpu and x.dtype == w.dtype and w.dtype in _DTYPES
            and not _active.off and w.dim() == 2 and w.is_contiguous() and x.dim() >= 1
            and 0 < x.numel() <= MAX_ROWS * x.shape[-1] and not torch.is_grad_enabled())


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, through the small-GEMM kernel where it applies (drafters' own products, e.g. a head's logits)."""
    if small_gemm() is not None and _applies(x, w):
        return _ext.linear(x, w, bias)
    return many_rows_linear(x, w, bias)


# Many-row bf16 products (prefill: a prompt's hundreds of rows) are bound by arithmetic, not memory. With AMX on
# (amx_on) they take the tiles (~1.5-2.7 TFLOP/s on the 2-core Xeon of stop 41). Without it, where the CPU's bf16 dot
# instruction is slow (the 2-core Emerald Rapids VMs of stops 32-40: vdpbf16ps ~0.4 a cycle, AMX not exposed) torch's
# bf16 GEMM runs at ~150 GFLOP/s while its float32 GEMM on the same values widened reaches ~250-330 (128-1024 rows);
# where bf16 is fast (Zen 4) torch's own path stays. Which is faster is timed once per process (a clear margin is
# needed, so the choice does not flip between runs); DRAFTTREE_WIDE_BF16=0/1 fixes it. Either way every product of two
# bf16 values is exact in float32, sums are float32 and the result is rounded to bf16 once: only the order of the
# sums differs, as between any two GEMM libraries.
WIDE_MIN_ROWS = MAX_ROWS + 1  # 65 rows: 1.1-1.2x faster widened here; 96: 0.9-1.2x; 128 and more: 1.4-1.9x
WIDE_CHUNK = 1 << 22  # weight elements widened at a time (16 MB of float32): an LM head is not copied whole
_wide: bool | None = None
# ... or through the small-GEMM kernel MAX_ROWS rows at a time, where that is faster still (timed once, see
# chunked_bf16_products): on the 2-core Zen 3 of stop 46 the kernel's 64-row products ran ~100 GFLOP/s against ~65-80
# for the widened float32 GEMM of a 130-row prompt, and it skips widening the weights. A prompt's rows then give the
# bits a decoding step gives them (one summation order per output, whatever the rows beside it). Only for weights of
# CHUNK_MIN_WEIGHT elements or more: below that the two tie or the widened one wins (a SmolLM2-135M prompt of 200
# tokens: 0.72 s in chunks against 0.66 s widened; Qwen2.5-Coder-1.5B, 130 tokens: 3.9 s against 5.4 s).
CHUNK_MIN_WEIGHT = 1 << 22
_chunked: bool | None = None


def _path_choice(variable: str, timed) -> bool:
    """A path choice fixed by ``variable`` (0/1), else ``timed()``; a bad value is one line on stderr, then timed."""
    env = os.environ.get(variable, "auto").strip().lower()
    if env not in ("1", "on", "true", "yes", "0", "off", "false", "no", "auto", ""):
        print(f"drafttree: {variable} must be 0, 1 or auto, not {env!r}; timing both paths instead", file=sys.stderr)
    return env in ("1", "on", "true", "yes") or (env not in ("0", "off", "false", "no") and timed())


def wide_bf16_products() -> bool:
    """Whether many-row bf16 products run in float32 on the widened values here (timed once, or DRAFTTREE_WIDE_BF16)."""
    global _wide
    if _wide is None:
        with _lock:
            if _wide is None:
                _wide = _path_choice("DRAFTTREE_WIDE_BF16", _time_wide)
    return _wide


def _best_time(f, reps: int = 5) -> float:
    import time

    f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def _timing_operands(rows: int = 256, k: int = 1024, n: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, k, generator=g).bfloat16(), torch.randn(n, k, generator=g).bfloat16()


def _time_wide() -> bool:
    x, w = _timing_operands()
    with torch.inference_mode():
        # widening anew each call: the choice also covers weights whose copies are not kept (big ones, a full cache)
        return _best_time(lambda: F.linear(x, w)) > 1.3 * _best_time(lambda: _widened(x, w, None, keep=False))


def chunked_bf16_products() -> bool:
    """Whether many-row bf16 products run through the small-GEMM kernel, MAX_ROWS rows at a time, here: timed once
    against the path they would take otherwise (widened or torch's), or fixed by DRAFTTREE_CHUNKED_BF16=0/1."""
    global _chunked
    if _chunked is None:
        if small_gemm() is None:
            return False
        wide_bf16_products()  # decided first (under the same lock): the timing below races the path it would replace
        with _lock:
            if _chunked is None:
                _chunked = _path_choice("DRAFTTREE_CHUNKED_BF16", _time_chunked)
    return _chunked


def _time_chunked() -> bool:
    # an MLP-sized product (a weight of ~27 MB, about this L3; ~0.5 s in all): on small ones the two paths tie
    # (Zen 3: 1536 x 8960 1.15-1.17x, 1024 x 1024 0.9x), and a whole prefill gained more (1.39x for a 1.5B model's)
    x, w = _timing_operands(128, 1536, 8960)
    other = (lambda: _widened(x, w, None)) if wide_bf16_products() else (lambda: F.linear(x, w))
    with torch.inference_mode():
        return _best_time(other, 3) > 1.08 * _best_time(lambda: _kernel_chunks(x, w, None), 3)


def _kernel_chunks(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    out = x2.new_empty((x2.shape[0], w.shape[0]))
    for a in range(0, x2.shape[0], MAX_ROWS):
        out[a:a + MAX_ROWS] = _ext.linear(x2[a:a + MAX_ROWS], w, bias)
    return out.view(*x.shape[:-1], w.shape[0])


# The float32 copies of the weights a prompt's products widen, kept (a copy per call cost ~40% of a SmolLM2-135M
# prefill on the Zen 3 of stop 48: allocating, touching and filling 2-7 MB per product, then reading it cold). Only
# weights under CHUNK_MIN_WEIGHT elements (bigger ones take the kernel's chunks or are widened a block at a time), up
# to DRAFTTREE_WIDE_CACHE_MB in all (default 1024: SmolLM2-135M's layers take 424 MB, a 1.5B model's attention 616;
# 0 turns it off). A copy is dropped with its weight and redone when the weight changes through the tensor (its version
# counter) or gets new storage. Writes that bypass the counter (``p.data.copy_(...)``, another alias of its memory)
# are not seen: call :func:`clear_wide_cache` after such an edit.
WIDE_CACHE_MB = 1024


def wide_cache_limit() -> int:
    """Bytes of float32 weight copies :func:`widened_weight` may keep (DRAFTTREE_WIDE_CACHE_MB, else WIDE_CACHE_MB)."""
    return settings.megabytes("DRAFTTREE_WIDE_CACHE_MB", WIDE_CACHE_MB)


_wide_copies = KeptCopies(wide_cache_limit)


def clear_wide_cache() -> None:
    """Drop every kept float32 weight copy (after editing weights in ways their version counter does not see)."""
    _wide_copies.clear()


def widened_weight(t: torch.Tensor) -> torch.Tensor:
    """``t.float()``, from a kept copy where ``t`` is a weight small enough to keep (see WIDE_CACHE_MB)."""
    hit = _wide_copies.get(t)
    if hit is not None:
        return hit
    # detached: a copy holding a graph would keep its weight alive
    kept = None if t.numel() >= CHUNK_MIN_WEIGHT else _wide_copies.put(t, t.numel() * 4, lambda: t.detach().float())
    return t.detach().float() if kept is None else kept


def _widened(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, keep: bool = True) -> torch.Tensor:
    xf = x.float()
    step = max(1, WIDE_CHUNK // max(1, w.shape[1]))
    if w.shape[0] <= step:
        wide = widened_weight if keep else torch.Tensor.float
        return F.linear(xf, wide(w), None if bias is None else wide(bias)).to(x.dtype)
    out = x.new_empty((*x.shape[:-1], w.shape[0]))
    for a in range(0, w.shape[0], step):
        b = min(a + step, w.shape[0])
        out[..., a:b] = F.linear(xf, w[a:b].float(), None if bias is None else bias[a:b].float())
    return out


def many_rows_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for products the small-GEMM kernel does not take at once: bf16 ones with many rows on AMX tiles or
    AVX2 panels where they are on (:func:`packed_on`), else through the kernel MAX_ROWS rows at a time where that was
    timed faster (:func:`chunked_bf16_products`), else, on a CPU whose bf16 arithmetic is slow, in float32 on the
    widened values (our own products only: fast_linears blocks and the drafters' :func:`linear`; never under
    torch_linears or with autograd; see WIDE_MIN_ROWS), else torch's product on a weight packed once (:mod:`onednn`)."""
    if (x.dtype is torch.bfloat16 and w.dtype is torch.bfloat16 and x.is_cpu and w.is_cpu and not _active.off
            and not torch.is_grad_enabled() and (bias is None or bias.dtype is torch.bfloat16)):
        if packed_on() and _ext.packable(w) and x.dim() >= 1 and x.shape[-1] == w.shape[1]:
            return _ext.linear(x, w, bias)  # AMX tiles and AVX2 panels take any row count (a prompt's products too)
        if _active.split is not None:
            out = _split_rows(x, w, bias)
            if out is not None:
                return out
        if (x.dim() >= 2 and w.dim() == 2 and w.is_contiguous() and x.shape[-1] == w.shape[1]
                and x.numel() > MAX_ROWS * x.shape[-1] and w.numel() >= CHUNK_MIN_WEIGHT and chunked_bf16_products()):
            return _kernel_chunks(x, w, bias)
        if (x.dim() >= 2 and w.dim() == 2 and x.numel() >= WIDE_MIN_ROWS * x.shape[-1]
                and wide_bf16_products()):
            return _widened(x, w, bias)
        if x.numel() > MAX_ROWS * x.shape[-1]:  # torch's product on a weight packed once (onednn.py)
            out = onednn.linear(x, w, bias)
            if out is not None:
                return out
    return F.linear(x, w, bias)
