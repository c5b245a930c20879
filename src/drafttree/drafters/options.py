"""One options schema per drafter family, validated once.

CLI flags, API keywords, server fields and benchmark specs (``eagle-chain:depth=3``) all arrive as a plain
dict; :func:`parse_options` resolves aliases (in one place: :data:`ALIASES`), converts strings, checks ranges
and rejects options the method does not take, each with a one-line error.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from drafttree.errors import DraftTreeError

AUTO = "auto"
MAX_CHILD = 256  # a static tree's child index: the index-th likeliest token at its parent


def _opt(default: Any, kind: str, low: float | None = None, doc: str = "") -> Any:
    return field(default=default, metadata={"kind": kind, "low": low, "doc": doc})


def _convert(name: str, kind: str, low: float | None, value: Any) -> Any:
    if value is None:
        return None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        s = str(value).lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise DraftTreeError(f"{name} must be true or false, got {value!r}")
    if kind == "size" and str(value).lower() == AUTO:
        return AUTO
    if kind in ("int", "size"):
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise DraftTreeError(f"{name} must be an integer{' or auto' if kind == 'size' else ''}, got {value!r}")
        try:
            value = int(value)
        except (TypeError, ValueError):
            raise DraftTreeError(
                f"{name} must be an integer{' or auto' if kind == 'size' else ''}, got {value!r}") from None
    elif kind == "float":
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise DraftTreeError(f"{name} must be a number, got {value!r}") from None
        if value != value:
            raise DraftTreeError(f"{name} must be a number, got nan")
    elif kind == "paths":
        if not (isinstance(value, (list, tuple)) and value and all(
                isinstance(p, (list, tuple)) and p and all(isinstance(i, int) and i >= 0 for i in p) for p in value)):
            raise DraftTreeError(f"{name} must be a list of paths of child indices, e.g. [[0], [0, 0], [1]]")
        paths = {tuple(p) for p in value}
        for p in value:
            if len(p) > 1 and tuple(p[:-1]) not in paths:
                raise DraftTreeError(f"{name}: path {list(p)} has no parent path {list(p[:-1])} (every path's prefixes "
                                     "must be paths too)")
            if max(p) >= MAX_CHILD:
                raise DraftTreeError(f"{name}: child index {max(p)} in path {list(p)} is too large (< {MAX_CHILD})")
        return [list(p) for p in value]
    elif kind == "str":
        value = str(value)
    if low is not None and kind in ("int", "size", "float") and value < low:
        raise DraftTreeError(f"{name} must be >= {low:g}, got {value}")
    return value


# Aliases kept for old flags and specs, resolved here only: (schema-independent, per-schema).
ALIASES = {"top_k_draft": "top_k"}


PRUNE_DOC = "a deeper level must beat the best tree so far (best) or the tree of every candidate (all: until stop 39)"
# a draft LM reads at most the context's last N tokens (0: all): its prefill of a long prompt is paid before its first
# draft (drafters/draft_model.py: DraftLMState); auto: as many as it can read in an eighth of the time plain decoding
# would take for the rest of the answer (sources/model_sources.py: DraftLMSource.prefill_window)
WINDOW_DOC = "a draft LM reads at most the context's last N tokens (0: all of it)"


@dataclass
class NoOptions:
    ALIASES: ClassVar[dict[str, str]] = {}


@dataclass
class LookupOptions:
    """Prompt lookup: continuations of the context's latest n-gram found earlier in the context."""

    ALIASES: ClassVar[dict[str, str]] = {"k": "num_tokens"}
    max_ngram: int = _opt(3, "int", 1, "longest n-gram matched")
    min_ngram: int = _opt(1, "int", 1, "shortest n-gram matched")
    num_tokens: int = _opt(10, "int", 1, "tokens copied after a match")
    max_candidates: int = _opt(4, "int", 1, "continuations merged into the tree")


@dataclass
class DraftLMOptions:
    """A small draft LM: a chain, or a top-k tree with ``tree=True``."""

    ALIASES: ClassVar[dict[str, str]] = {"k": "depth"}
    depth: int = _opt(4, "int", 1, "draft length (tree depth)")
    tree: bool = _opt(False, "bool", None, "draft a dynamic top-k tree instead of a chain")
    top_k: int = _opt(4, "int", 1, "children per expanded node (trees)")
    total_tokens: int | str = _opt(16, "size", 1, "tree tokens verified, or auto (fitted to this machine)")
    max_total: int = _opt(32, "int", 2, "largest tree the auto budget may choose")
    live_curve: bool = _opt(True, "bool", None, "correct the cached verify-cost curve by the verify forwards' own "
                            "times (lone decoding; auto-sized trees)")
    window: int = _opt(0, "int", 0, WINDOW_DOC)


@dataclass
class EagleOptions:
    """EAGLE head drafters; ``None`` means the method's own default (see drafters/eagle.py)."""

    ALIASES: ClassVar[dict[str, str]] = {"k": "depth"}
    depth: int | None = _opt(None, "int", 1, "draft depth / chain length")
    top_k: int = _opt(8, "int", 1, "EAGLE-2 frontier width")
    total_tokens: int | str = _opt(AUTO, "size", 1, "EAGLE-2 tree tokens, or auto (fitted to this machine)")
    max_total: int = _opt(64, "int", 2, "largest tree the auto budget may choose")
    # on since stop 53: side by side (Zen 4, bf16, six tasks T=0) eagle2 1.06x -> 1.17x `ar` (docs/benchmarks.md)
    live_curve: bool = _opt(True, "bool", None, "correct the cached verify-cost curve by the verify forwards' own "
                            "times (lone decoding; auto-sized trees)")
    threshold: float = _opt(-1.0, "float", None, "stop a chain when its cumulative log-prob falls below this")
    tree: list | None = _opt(None, "paths", None, "EAGLE-1 static tree paths")
    ldlp: Any = _opt(None, "object", None, "a trained length predictor (default: the one next to the head)")
    depth_slack: int = _opt(1, "int", 0, "eagle2-ldlp: tree depth = predicted length + slack")
    prune_against: str = _opt("best", "str", None, PRUNE_DOC)


@dataclass
class HybridOptions:
    """Every loaded source in one ranked tree (see drafters/hybrid.py)."""

    ALIASES: ClassVar[dict[str, str]] = {"k": "num_tokens"}  # as lookup's, which auto was with nothing loaded
    sources: str = _opt("ngram+corpus+head+draft", "str", None, "sources to use, joined by +")
    top_k: int = _opt(8, "int", 1, "model sources' frontier width")
    depth: int = _opt(8, "int", 1, "model sources' deepest level")
    total_tokens: int | str = _opt(AUTO, "size", 1, "tree tokens verified, or auto (fitted to this machine)")
    max_total: int = _opt(64, "int", 2, "largest tree the auto budget may choose")
    gate: bool = _opt(True, "bool", None, "run costly sources only while they pay")
    # off by default since stop 41: on the six tasks, the held-out classes and the diagnostic prompts at T=1 it closed
    # the head more than paid (auto 1.21x -> 1.25x, 1.22x -> 1.27x, 1.13x -> 1.21x `ar` without it; docs/benchmarks.md)
    draft_gate: bool = _opt(False, "bool", None, "alone at T>0, draft at all only while it pays (needs gate)")
    # off: side by side (stop 52) it gained on the six tasks (auto 1.24x -> 1.26x `ar`), the held-out classes (1.63x ->
    # 1.69x) and one free-text user (77 -> 80 tok/s) but lost at L (2.09x -> 1.97x, tau 3.54 -> 3.03): a gate closed
    # after a miss stayed closed until a probe; with a third situation (after a gated round) still 2.01x -> 1.95x
    greedy_gate: bool = _opt(False, "bool", None, "alone at T=0 too, draft at all only while it pays; when closed the "
                             "n-grams still draft where their best first token pays (needs gate)")
    max_ngram: int = _opt(4, "int", 1, "longest n-gram the suffix index matches")
    num_tokens: int = _opt(12, "int", 1, "tokens per n-gram continuation")
    max_candidates: int = _opt(8, "int", 1, "n-gram continuations per round")
    extend: bool = _opt(False, "bool", None, "a draft LM also drafts on after the n-grams' likeliest branch")
    draft_window: int | str = _opt(AUTO, "size", 0, WINDOW_DOC + ", or auto (what an eighth of the answer's decoding "
                                   "time reads)")
    costly_in_batches: bool = _opt(False, "bool", None, "costly sources (head, draft LM) draft in batched rounds too")
    # off: side by side (stop 52, S T=0) it gated the head more (0.21 -> 0.13 of its drafts accepted per forward) for
    # no time saved (drafting stayed 8% of the wall: the free sources' share); auto 1.20x vs 1.26x `ar` without it
    clock_cost: bool = _opt(False, "bool", None, "costly sources' level costs corrected by the clock where it says "
                            "they take longer than modelled")
    # off: side by side (stop 81, ten held-out classes at T=1, two alternated pairs) `auto` 1.02x / 1.04x our `ar` with
    # it against 1.05x / 1.02x without (tau 1.26 / 1.35 vs 1.30 / 1.26): no gain measured (docs/benchmark-notes.md)
    noise_cells: bool = _opt(False, "bool", None, "at T>0 the free sources' calibration cells are split by the bin of "
                             "each candidate's own noise (sources/base.py: NoiseCalibration)")
    # on since stop 53: side by side (Zen 4, bf16) six tasks T=0 1.34x -> 1.37x `ar`, T=1 1.03x -> 1.07x (three tasks
    # below `ar` -> none), held-out classes 1.57x -> 1.54x, L 2.28x -> 2.29x; the cached curve had 8 tokens at 1.30x one
    # token where decoding timed ~2.1x (logs/s53_t1_long.py)
    live_curve: bool = _opt(True, "bool", None, "correct the cached verify-cost curve by the verify forwards' own "
                            "times (lone decoding)")
    corpus: str | None = _opt(None, "str", None, "corpus file for the corpus source (default: the head's corpus.npz)")
    batch_pass: bool = _opt(False, "bool", None, "batched rows draft their heads together (one forward per level)")
    batch_pack: bool = _opt(True, "bool", None, "in a batch, offer every node that could pay and let the batch keep "
                            "the best nodes over all rows (false: each row sizes its own tree on its share)")
    prune_against: str = _opt("best", "str", None, PRUNE_DOC)
    # the default is sources.model_sources.EXPLORE (a test checks they agree; importing it here would pull in torch)
    explore: float = _opt(0.0, "float", 0.0, "model sources: standard errors added to a level's learnt rate")
    agree: bool = _opt(True, "bool", None, "nodes several sources proposed are rated by what their agreement was "
                       "worth (learnt online); false: the best single source's estimate")
    floored_curve: bool = _opt(False, "bool", None, "alone too, no token past the verify curve's compute-bound size "
                               "cheaper than its mean (as in a batch)")


@dataclass
class SwitchOptions:
    """Prompt lookup when the context matches, else the model drafter."""

    ALIASES: ClassVar[dict[str, str]] = {}
    max_ngram: int = _opt(3, "int", 1, "prompt lookup: longest n-gram matched")
    num_tokens: int = _opt(10, "int", 1, "prompt lookup: tokens copied after a match")
    max_candidates: int = _opt(4, "int", 1, "prompt lookup: continuations per round")
    top_k: int | None = _opt(None, "int", 1, "model drafter's frontier width")
    depth: int | None = _opt(None, "int", 1, "model drafter's depth")
    max_total: int | None = _opt(None, "int", 2, "model drafter's largest tree")


S = TypeVar("S")


def option_names(schema: type) -> list[str]:
    return [f.name for f in fields(schema)]


def parse_options(schema: type[S], method: str, raw: dict | None) -> S:
    """Validate ``raw`` against ``schema`` for ``method``; unknown, repeated or bad values raise."""
    names = {f.name: f for f in fields(schema)}
    values: dict[str, Any] = {}
    if raw is not None and not isinstance(raw, dict):
        raise DraftTreeError(f"method options must be a dict of name: value, got {type(raw).__name__} {raw!r}")
    for key, value in (raw or {}).items():
        name = key.replace("-", "_")
        name = ALIASES.get(name, name)
        name = schema.ALIASES.get(name, name)
        if name not in names:
            takes = ", ".join(sorted(names)) or "no options"
            raise DraftTreeError(f"option {key!r} does not apply to method {method!r} (it takes: {takes})")
        if name in values:
            raise DraftTreeError(f"option {name!r} given twice for method {method!r}")
        meta = names[name].metadata
        label = name if key == name else f"{key} ({name})"
        if value is None and names[name].default is not None:  # None is "the method's own default" only where that
            raise DraftTreeError(f"{label} must be given a value, got None (leave it out for the default, "  # is it
                                 f"{names[name].default!r})")
        values[name] = value if meta["kind"] == "object" else _convert(label, meta["kind"], meta["low"], value)
    for name, f in names.items():
        if name not in values and f.default is MISSING:
            raise DraftTreeError(f"method {method!r} needs option {name!r}")
    return schema(**values)
