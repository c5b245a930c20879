"""A tree budget fitted to the machine: how many tokens to verify, and how deep to draft, per round.

Verifying N tree tokens costs f(N) seconds, a curve that depends on the machine, dtype and model (on a
2-core bf16 CPU 32 tokens cost ~1.4 single steps; on a GPU ~1). It is measured once per (model, dtype,
device, threads, torch) and cached. Each round the EAGLE-2 draft confidences (product of draft
probabilities along a path) estimate how likely each node is to be accepted, so a tree of the best N
nodes is expected to yield 1 + c * sum(exp(score_i)) tokens, with c an online calibration factor
(observed / predicted accepted tokens). The budget picks the N, and stops drafting deeper, where expected
tokens per second peaks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from drafttree.kernels import kernel_key, torch_linears
from drafttree.kernels.memory import huge_page_bytes
from drafttree.paths import calibration_dir

# 17, 33 and 65: one past a multiple of 16, where a CPU's AMX tiles (16 rows each) take one more block of rows: there
# 17 tokens cost about what 32 do (stop 62's Xeon: 16 tokens 28.7 ms, 24 39.8, 32 43.2), and a curve through 16 and 24
# alone read the 17th token as costing an eighth of the step it does (a batch of 16 rows verified drafts that could
# not pay). Elsewhere the extra points only sample the curve more finely.
SIZES = [1, 2, 4, 8, 12, 16, 17, 24, 32, 33, 48, 64, 65, 96]


@dataclass
class CostModel:
    sizes: list[int]
    seconds: list[float]  # seconds of one target forward verifying N tokens (the fastest of the timings)
    context: int = 0  # tokens of context the curve was measured on
    per_key: float = 0.0  # seconds each verified token adds per token of context (its attention over the keys)

    def at(self, length: int) -> CostModel:
        """The curve for a sequence of ``length`` tokens: each verified token attends to every one of them, so a
        tree over a 1,000-token article costs more than over the curve's own context (on a 2-core CPU in bf16 a
        16-token tree ~5 ms more, a sixth of its cost). Context is bucketed by 64 tokens (the curves are memoised)."""
        if self.per_key <= 0:
            return self
        bucket = max(0, int(length) + 32) // 64 * 64
        memo = self.__dict__.setdefault("_at", {})
        if bucket not in memo:
            if len(memo) > 256:
                memo.clear()
            shift = self.per_key * (bucket - self.context)
            seconds = [max(0.5 * s, s + shift * n) for n, s in zip(self.sizes, self.seconds)]
            memo[bucket] = CostModel(self.sizes, seconds, bucket, self.per_key)
        return memo[bucket]

    def verify(self, n: int) -> float:
        """Seconds of one forward verifying ``n`` tokens (interpolated; memoised: the budget and the pruners ask for
        the same few sizes thousands of times a generation, and a curve is never changed once made)."""
        memo = self.__dict__.get("_verify")
        if memo is None:
            memo = self.__dict__["_verify"] = {}
        v = memo.get(n)
        if v is None:
            if len(memo) > 4096:
                memo.clear()
            v = memo[n] = self._interpolate(n)
        return v

    def _interpolate(self, n: int) -> float:
        xs, ys = self.sizes, self.seconds
        if n <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return ys[-1] * n / xs[-1]

    def verify_many(self, ns: torch.Tensor) -> torch.Tensor:
        """:meth:`verify` of every size in ``ns`` at once (float64)."""
        cached = self.__dict__.get("_curve")
        if cached is None or cached[0] != (self.sizes, self.seconds):  # tensors of the curve, made once
            cached = ((list(self.sizes), list(self.seconds)), torch.tensor(self.sizes, dtype=torch.float64),
                      torch.tensor(self.seconds, dtype=torch.float64))
            self.__dict__["_curve"] = cached
        _, xs, ys = cached
        n = ns.to(torch.float64)
        i = torch.searchsorted(xs, n).clamp(1, len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        inside = y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return torch.where(n <= xs[0], ys[0], torch.where(n > xs[-1], ys[-1] * n / xs[-1], inside))

    def compute_bound(self) -> tuple[int, float] | None:
        """(K, c) where forwards of K tokens and more are compute-bound here, each token costing ~c; None where the
        measured curve never gets there. K is the smallest measured size whose cost per token is within 1.5x of the
        cheapest, c the mean cost per token added from K to the largest size, and compute-bound means c is at least
        3/4 of the largest size's cost per token (little fixed cost left to share). This 2-core CPU: K = 8, c ~4 ms
        (SmolLM2-135M, bf16); a GPU's flat curve, or one whose extra tokens still cost far below the average: None."""
        got = self.__dict__.get("_bound")
        if got is None or got[0] != (self.sizes, self.seconds):
            per = [s / n for n, s in zip(self.sizes, self.seconds)]
            k = next(n for n, a in zip(self.sizes, per) if a <= 1.5 * min(per))
            last = self.sizes[-1]
            bound = None
            if k < last:
                c = (self.seconds[-1] - self.verify(k)) / (last - k)
                bound = (k, c) if c >= 0.75 * per[-1] else None
            got = ((list(self.sizes), list(self.seconds)), bound)
            self.__dict__["_bound"] = got
        return got[1]

    def verify_in_batch(self, n: int) -> float:
        """:meth:`verify` for a batch's forward of ``n`` tokens, where each token past the compute-bound size K adds
        at least c (:meth:`compute_bound`): the measured curve dips there by timing noise (12 -> 16 tokens ~1-2.5 ms
        a token on this CPU, 8 -> 12 and 16 -> 24 3.2-3.7), and a dip read as a cheap token lets rows of a big batch
        draft nodes that pay only against the dip."""
        self._batch_table(n)
        return self.__dict__["_batch"][1][max(1, n)]

    def verify_many_in_batch(self, ns: torch.Tensor) -> torch.Tensor:
        """:meth:`verify_in_batch` of every size in ``ns`` at once (float64)."""
        table = self._batch_table(int(ns.max()) if ns.numel() else 1)
        return table[ns.clamp(min=1).long()]  # float64

    def _batch_table(self, n: int) -> torch.Tensor:
        """g(m) for m <= n (float64, memoised, grown as needed): g = verify up to K, then max(verify(m), g(m-1) + c)."""
        table = self.__dict__.get("_batch")  # (the curve it was made from, g as a list, g as a tensor)
        if table is None or table[0] != (self.sizes, self.seconds) or len(table[1]) <= n:
            k, c = self.compute_bound() or (math.inf, 0.0)
            g = [0.0]
            for m in range(1, max(2 * n, 2 * self.sizes[-1]) + 1):  # grown by doubling: rebuilt rarely
                y = self.verify(m)
                g.append(max(y, g[-1] + c) if m > k else y)
            table = ((list(self.sizes), list(self.seconds)), g, torch.tensor(g, dtype=torch.float64))
            self.__dict__["_batch"] = table
        return table[2]

    def floored(self) -> CostModel:
        """This curve with :meth:`verify_in_batch`'s floor at its measured sizes (for a lone sequence, an option)."""
        return CostModel(list(self.sizes), [self.verify_in_batch(n) for n in self.sizes], self.context, self.per_key)

    def relative(self) -> dict[int, float]:
        return {n: round(s / self.seconds[0], 3) for n, s in zip(self.sizes, self.seconds)}


@dataclass
class BatchShare:
    """What one row of a batched forward weighs its tree against: the whole round. Every row waits for the round, so
    a row's extra node is worth its expected tokens against the time it adds for all rows; the row maximises the
    batch's tokens per second, (its tokens + ``others_tokens``) / the forward over its ``n`` tokens on top of the
    other rows' ``others`` tokens. Trees shrink as the batch grows (a node must beat the batch's own rate, not the
    row's) and, on a GPU where the curve is flat, hardly at all. ``extra_tokens`` is what budgets add to a row's
    expected tokens (0 for a lone sequence's :class:`CostModel`)."""

    base: CostModel
    others: int
    rows: int
    others_tokens: float = 0.0  # tokens the other rows are expected to commit this round (their roots at least)
    # what the curve does not see (BatchDecoder measures it): ``fixed`` seconds the batch's forward took beyond the
    # curve at its token count (every row attends over its own context: a 16-row forward ~5 ms more than one
    # 16-token tree on this CPU), and ``per_node`` seconds each of this row's nodes adds by attending over its context
    fixed: float = 0.0
    per_node: float = 0.0
    # the batch keeps the best nodes over every row (BatchDecoder's packing): a drafter that can rank its nodes
    # (Drafter.ranked) offers every node that could pay on its own (above the batch's bar), not a tree sized here
    packed: bool = False

    @property
    def extra_tokens(self) -> float:
        return self.others_tokens

    def verify(self, n: int) -> float:
        return self.base.verify_in_batch(self.others + n) + self.fixed + self.per_node * n

    def verify_many(self, ns: torch.Tensor) -> torch.Tensor:
        return self.base.verify_many_in_batch(ns + self.others) + self.fixed + self.per_node * ns.to(torch.float64)


PRUNE_RULES = ("best", "all")


def check_prune_rule(rule: str) -> str:
    if rule not in PRUNE_RULES:
        from drafttree.errors import DraftTreeError

        raise DraftTreeError(f"prune_against must be one of {', '.join(PRUNE_RULES)}, got {rule!r}")
    return rule


def best_tree(sorted_scores: torch.Tensor | list[float], fixed: float, verify, max_nodes: int, scale: float = 1.0,
              extra: float = 0.0, rule: str = "best") -> tuple[int, float, float]:
    """The tree a round would verify now: of the root plus the ``n`` best candidates (scores best first), the ``n``
    with the most expected tokens per unit of time. Returns (n, expected tokens, time); ``verify(n)`` is the cost of
    verifying n tokens, ``fixed`` what the round costs besides verification (drafting so far), ``scale`` the
    calibration of exp(score), ``extra`` tokens that come whatever the tree (a batch's other rows). A deeper level
    must beat this tree, not the tree of every candidate drafted so far: most of those (unlikely siblings; at T > 0
    nearly all but the noise's top token) would never be verified, so their verification must not make one more
    level look cheap. ``rule="all"``: the tree of every candidate (the rule until stop 39, kept for side-by-side
    runs). Plain floats: it runs once per drafted level, on a few dozen candidates, where tensor ops cost more."""
    if isinstance(sorted_scores, torch.Tensor):
        sorted_scores = sorted_scores.tolist()
    m = min(len(sorted_scores), max(0, max_nodes))
    gains = 1.0 + extra
    best = (0, gains, fixed + verify(1))
    for i in range(m):
        gains += scale * math.exp(sorted_scores[i])
        t = fixed + verify(i + 2)
        if rule == "all" or gains / t > best[1] / best[2]:
            best = (i + 1, gains, t)
    return best


def joining(frontier_scores: list[float], sorted_scores: list[float], n: int) -> list[int]:
    """Nodes a level adds to the verified tree when it expands the first w frontier nodes, for each w: a child of
    each, plus each expanded node itself where it is not among the ``n`` best already (a child is verified only
    under its parent)."""
    bar = sorted_scores[n - 1] if n > 0 else math.inf
    out, count = [], 0
    for score in frontier_scores:
        count += 1 + (score < bar)
        out.append(count)
    return out


_SLOPES: dict[tuple, float] = {}


def least_slope(cost, n_max: int) -> float:
    """min over n = 1..n_max of (verify(1 + n) - verify(1)) / n: the cheapest a token can come in a tree of up
    to n_max nodes on top of the root (memoised per curve and batch: it is asked once per row per round)."""
    base = getattr(cost, "base", cost)
    others = getattr(cost, "others", None)
    key = (tuple(base.sizes), tuple(base.seconds), others, n_max)
    if key not in _SLOPES:
        if len(_SLOPES) > 4096:
            _SLOPES.clear()
        curve = base if others is None else BatchShare(base, others, 2)  # a share's fixed part cancels here
        v1 = curve.verify(1)
        _SLOPES[key] = min((curve.verify(1 + n) - v1) / n for n in range(1, max(2, n_max + 1)))
    return _SLOPES[key] + getattr(cost, "per_node", 0.0)  # a row's per-node cost adds to every slope


# bump when the verify path or the measurement changes (2: grouped tree attention, 3: small-GEMM kernel, 4: cost per
# context token, 5: the fastest of paired timings instead of the median, 6: the decoder stack's loop, model_loop.py)
CURVE_VERSION = "7"  # 7: SIZES with 17, 33, 65


def _key(runner, name: str) -> str:
    dev = runner.device
    parts = [CURVE_VERSION, name, str(runner.dtype), dev.type, str(torch.get_num_threads()), torch.__version__,
             str(getattr(runner.config, "num_hidden_layers", "")), str(getattr(runner.config, "hidden_size", "")),
             kernel_key() if dev.type == "cpu" else ""]
    if dev.type == "cuda":
        parts.append(torch.cuda.get_device_name(dev))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def measure_verify_costs(runner, context: int = 256, reps: int = 7, sizes: list[int] | None = None,
                         show_progress: bool = False, long_context: int = 2048) -> CostModel:
    """Time target forwards over chains of N tokens on a ``context``-token prefix (the fastest of 2 x ``reps``), and
    what each verified token adds per token of context (32 tokens against 1, on ``context`` and on ``long_context``:
    a contrast of ~20 ms on a 2-core CPU, well above the timing noise)."""
    cm = _measure(runner, {"": contextlib.nullcontext}, context, reps, sizes, show_progress)[""]
    long_context = min(long_context, runner.max_positions // 2)
    if long_context - cm.context >= 256:
        short = [cm.verify(1), cm.verify(32)]  # the curve itself measured both at ``context``
        far = _measure(runner, {"": contextlib.nullcontext}, long_context, reps, [1, 32], False)[""].seconds
        cm.per_key = max(0.0, ((far[1] - far[0]) - (short[1] - short[0])) / (31 * (long_context - cm.context)))
    return cm


def compare_linear_kernels(runner, context: int = 256, reps: int = 7, sizes: list[int] | None = None,
                           show_progress: bool = False) -> dict[str, CostModel]:
    """The verify-cost curve with torch's linear kernels and with the small-GEMM kernel, measured interleaved
    (each pass times both at every size, so a change in machine load hits both alike)."""
    return _measure(runner, {"torch": torch_linears, "small-gemm": contextlib.nullcontext}, context, reps, sizes,
                    show_progress)


@torch.inference_mode()
def _measure(runner, modes: dict, context: int, reps: int, sizes: list[int] | None,
             show_progress: bool) -> dict[str, CostModel]:
    from tqdm.auto import tqdm

    context = min(context, runner.max_positions // 2)
    sizes = [n for n in (sizes or SIZES) if context + n < runner.max_positions]
    vocab = runner.lm_head.weight.shape[0]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (context,), generator=g)
    runner.prefill(prompt)
    tokens = {n: torch.randint(0, vocab, (n,), generator=g).to(runner.device) for n in sizes}

    def forward(n: int, mode) -> float:
        idx = torch.arange(n, device=runner.device)
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
        with mode():
            t0 = time.perf_counter()
            runner.forward_tree(tokens[n], idx, idx[:, None] >= idx[None, :])
            if runner.device.type == "cuda":
                torch.cuda.synchronize(runner.device)
            return time.perf_counter() - t0

    for mode in modes.values():  # warm-up: first calls of each shape pay for allocations and kernel selection
        for n in sizes:
            forward(n, mode)
    times = {(name, n): [] for name in modes for n in sizes}
    for _ in tqdm(range(reps), desc="verify-cost calibration", unit="pass", disable=not show_progress,
                  leave=False):
        for n in sizes:  # interleaved, so a change in machine load hits every size (and mode) alike
            for name, mode in modes.items():
                # two forwards of each size in a row, as in decoding, where sizes change little between rounds
                times[name, n] += [forward(n, mode), forward(n, mode)]
    runner.discard_pending()
    curves = {}
    for name in modes:
        # the fastest: a shared machine only ever adds time. On this 2-core CPU (an L3 as big as the weights, shared)
        # one run in three or four had most of its one-token forwards 2-3 ms (15-20%) slower than decoding's (median
        # and lower quartile alike), which made small trees look nearly free; the fastest of 14 was within 0.5 ms
        secs = [min(times[name, n]) for n in sizes]
        for i in range(1, len(secs)):  # enforce monotonicity (noise can make a bigger batch look cheaper)
            secs[i] = max(secs[i], secs[i - 1])
        curves[name] = CostModel(sizes, secs, context)
    return curves


def calibration_path(runner, name: str) -> Path:
    return calibration_dir() / f"verify-{_key(runner, name)}.json"


_LOADED: dict[Path, tuple[tuple[int, int], CostModel]] = {}  # curves read from disk, by file mtime and size


def _read_curve(path: Path) -> CostModel:
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _LOADED.get(path)
    if cached is None or cached[0] != stamp:  # read once per process (a server builds drafters per request)
        d = json.loads(path.read_text())
        cached = _LOADED[path] = (stamp, CostModel(d["sizes"], d["seconds"], d.get("context", 0),
                                                   d.get("per_key", 0.0)))
    return cached[1]


@contextlib.contextmanager
def _measuring_lock(path: Path):
    """One process measures a curve at a time (two servers or test workers starting together): the others wait and
    then read its file, instead of timing forwards against each other's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the atomic write below still keeps readers from half a file
        yield
        return
    with open(path.with_suffix(".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cost_model_for(runner, name: str, refresh: bool = False, quiet: bool = False) -> CostModel:
    """The cached verify-cost curve of this model on this machine, measured (with a visible line) on first use
    or when ``refresh``; ``drafttree calibrate`` runs and prints it."""
    path = calibration_path(runner, name)
    if path.exists() and not refresh:
        return _read_curve(path)
    with _measuring_lock(path):
        if path.exists() and not refresh:  # another process measured it while this one waited
            return _read_curve(path)
        if not quiet:
            print(f"[drafttree] measuring how long {name} takes to verify 1..{SIZES[-1]} tokens on this machine "
                  f"(once per machine; cached in {path})", file=sys.stderr, flush=True)
        cm = measure_verify_costs(runner, show_progress=not quiet)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"model": name, "dtype": str(runner.dtype), "device": str(runner.device),
                                   "threads": torch.get_num_threads(), "sizes": cm.sizes, "seconds": cm.seconds,
                                   "relative": cm.relative(), "context": cm.context, "per_key": cm.per_key},
                                  indent=1))
        os.replace(tmp, path)  # readers see the old file or the whole new one, never half of it
        st = path.stat()
        _LOADED[path] = ((st.st_mtime_ns, st.st_size), cm)
    return cm


@dataclass
class TreeBudget:
    """Per-round choice of the verified tree size and of the drafting depth."""

    cost: CostModel
    max_total: int = 64
    min_total: int = 2
    calibration: float = 1.0  # observed accepted drafts / sum of exp(scores) of the verified nodes
    overhead: float = 0.0  # seconds per round outside drafting and verification (EMA)
    decay: float = 0.9
    history: list[dict] = field(default_factory=list)
    prune_against: str = "best"  # what a deeper level must beat (best_tree's rule)

    def choose_total(self, sorted_scores: torch.Tensor | list[float], draft_seconds: float) -> int:
        """Best number of tree tokens (root included) given the candidates' scores, best first.

        Plain floats: it runs once per row per round, on a few dozen candidates at most, where tensor ops would
        cost more than the arithmetic."""
        if isinstance(sorted_scores, torch.Tensor):
            sorted_scores = sorted_scores.tolist()
        m = min(len(sorted_scores), self.max_total - 1)
        if m <= 0:
            return 1
        extra = getattr(self.cost, "extra_tokens", 0.0)  # a batch: the other rows' tokens of the same round
        fixed = draft_seconds + self.overhead
        base_rate = (1.0 + extra) / (fixed + self.cost.verify(1))
        gains, best, best_rate = 1.0 + extra, 0, -1.0
        for i in range(m):
            gains += self.calibration * math.exp(sorted_scores[i])
            rate = gains / (fixed + self.cost.verify(i + 2))
            if rate > best_rate:
                best, best_rate = i + 2, rate
        if best_rate <= base_rate:
            return max(1, min(self.min_total, m + 1))
        return max(best, min(self.min_total, m + 1))

    def worth_deeper(self, best_scores: torch.Tensor, frontier_scores: torch.Tensor, draft_seconds: float,
                     level_seconds: float) -> bool:
        """Expanding one more level adds at most c * sum(exp(frontier)) expected tokens for one more drafter
        call and a child of each frontier node to verify; go on only if that beats the best tree's rate now."""
        best = best_scores.tolist()
        n, e_now, t_now = best_tree(best, draft_seconds + self.overhead, self.cost.verify, self.max_total - 1,
                                    self.calibration, getattr(self.cost, "extra_tokens", 0.0), self.prune_against)
        frontier = frontier_scores.tolist()
        gain = self.calibration * sum(math.exp(f) for f in frontier)
        # the nodes joining the tree ("all": none, as the old rule had it)
        f = joining(frontier, best, n)[-1] if self.prune_against == "best" and frontier else 0
        t_next = t_now + level_seconds + self.cost.verify(n + 1 + f) - self.cost.verify(n + 1)
        return (e_now + gain) / t_next > e_now / t_now

    def observe(self, predicted_drafts: float, accepted_drafts: int, round_seconds: float, draft_seconds: float,
                verify_seconds: float) -> None:
        if predicted_drafts > 0:
            ratio = min(3.0, max(0.05, accepted_drafts / predicted_drafts))
            self.calibration = self.decay * self.calibration + (1 - self.decay) * ratio
        other = max(0.0, round_seconds - draft_seconds - verify_seconds)
        self.overhead = self.decay * self.overhead + (1 - self.decay) * other if self.overhead else other


class BudgetRounds:
    """Feeds each round's outcome (measured drafting and round time, accepted drafts) back into a
    :class:`TreeBudget`. Timings may steer tree sizes freely: they never change the output (noise.py)."""

    def __init__(self, budget: TreeBudget, live=None):
        self.budget = budget
        self.base = budget.cost  # the single-sequence curve; a batched round charges a BatchShare of it
        self.live = live  # a live_curve.LiveCurve correcting ``base`` by lone rounds' verify times, or None
        self._round: tuple | None = None

    def begin(self) -> None:
        self._round = None

    def start(self, cost=None, context: int = 0) -> TreeBudget:
        """The budget for this round; ``cost`` (a :class:`BatchShare`) replaces the curve for this round only, else
        the curve at this sequence's ``context`` length."""
        self._t0 = time.perf_counter()
        base = self.live.curve if self.live is not None else self.base
        self.budget.cost = cost if cost is not None else base.at(context)
        return self.budget

    def verified(self, tokens: int, context: int, seconds: float) -> None:
        if self.live is not None:
            self.live.observe(tokens, context, seconds)

    def record(self, budget: TreeBudget, expected: float, size: int) -> None:
        """After drafting: the tree's predicted accepted drafts and its size."""
        self._round = (budget, expected, self._t0, time.perf_counter() - self._t0, size)

    def observe(self, accepted_drafts: int) -> None:
        if self._round is None:
            return
        budget, expected, t_start, t_draft, n = self._round
        budget.observe(expected, accepted_drafts, time.perf_counter() - t_start, t_draft, budget.cost.verify(n))
        self._round = None


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a forward reads from weights: every parameter, except an input embedding that is only gathered
    (a tied embedding is read whole, as the LM head)."""
    emb = model.get_input_embeddings().weight
    tied = emb.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    return sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not emb)


@torch.inference_mode()
def read_bandwidth(device: torch.device, megabytes: int = 256, reps: int = 5) -> float:
    """Bytes per second this device reads (best of ``reps`` sums over a ``megabytes`` buffer; on the CPU in huge
    pages, like the weights: see :mod:`drafttree.kernels.memory`)."""
    n = megabytes * 2**20 // 4
    raw = huge_page_bytes(n * 4) if device.type == "cpu" else None
    x = raw.view(torch.float32).fill_(1.0) if raw is not None else torch.ones(n, dtype=torch.float32, device=device)
    x.sum()
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        x.sum()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best
