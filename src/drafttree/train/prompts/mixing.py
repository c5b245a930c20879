"""Selecting the prompts: the benchmark-overlap filter, the category / source mix, the output file."""

from __future__ import annotations

import json
import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from drafttree.train.prompts.core import (
    CATEGORY_WEIGHTS,
    SOURCE_WEIGHTS,
    Candidate,
    clean_candidates,
    to_record,
    word_tokens,
)

OVERLAP_NGRAM = 13


class BenchIndex:
    """Finds training prompts that overlap evaluation questions.

    A prompt overlaps when, after lower-casing and dropping punctuation and whitespace differences, it
    contains a whole benchmark question (short questions) or shares a run of ``n`` words with one (long
    questions, e.g. HumanEval stubs or CNN/DailyMail articles). Questions of fewer than ``min_words`` words
    only match a prompt that is exactly the same.
    """

    def __init__(self, questions: Iterable[str], n: int = OVERLAP_NGRAM, min_words: int = 4):
        self.n = n
        self.exact: set[tuple[str, ...]] = set()
        self.ngrams: set[tuple[str, ...]] = set()
        self.short: dict[tuple[str, str], list[tuple[str, ...]]] = defaultdict(list)
        self.size = 0
        for q in questions:
            toks = tuple(word_tokens(q))
            if not toks:
                continue
            self.size += 1
            self.exact.add(toks)
            if len(toks) >= n:
                self.ngrams.update(toks[i : i + n] for i in range(len(toks) - n + 1))
            elif len(toks) >= min_words:
                self.short[toks[:2]].append(toks)

    def overlaps(self, text: str) -> bool:
        toks = tuple(word_tokens(text))
        if toks in self.exact:
            return True
        n = self.n
        if self.ngrams and any(toks[i : i + n] in self.ngrams for i in range(len(toks) - n + 1)):
            return True
        if self.short:
            for i in range(len(toks) - 1):
                for q in self.short.get(toks[i : i + 2], ()):
                    if toks[i : i + len(q)] == q:
                        return True
        return False


def read_bench_questions(bench_dirs: Iterable[Path]) -> list[str]:
    """Every turn of every question in the ``*.jsonl`` files of the given folders."""
    questions: list[str] = []
    for d in bench_dirs:
        for path in sorted(Path(d).glob("*.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                obj = json.loads(line)
                turns = obj.get("turns") or [obj.get("question") or obj.get("prompt") or ""]
                questions.extend(t for t in turns if isinstance(t, str) and t.strip())
    return questions


def filter_overlaps(
    candidates: Sequence[Candidate], index: BenchIndex, show_progress: bool = False
) -> tuple[list[Candidate], list[Candidate]]:
    """Split candidates into (kept, dropped because they overlap a benchmark question)."""
    kept, dropped = [], []
    for c in tqdm(candidates, desc="benchmark overlap check", unit="prompt", disable=not show_progress):
        (dropped if index.overlaps(c.text) else kept).append(c)
    return kept, dropped


def default_bench_dirs() -> list[Path]:
    """``../shared/data/bench`` next to the repository, and the package's own question files if any."""
    package = Path(__file__).resolve().parents[2]  # .../src/drafttree
    dirs = [package.parents[1].parent / "shared" / "data" / "bench", package / "bench" / "questions"]
    return [d for d in dirs if d.is_dir() and any(d.glob("*.jsonl"))]


# ---------------------------------------------------------------------------------------------- mixing


def allocate(
    total: int, available: dict[str, int], weights: dict[str, float] | None = None
) -> dict[str, int]:
    """Split ``total`` among keys in proportion to ``weights``, never above ``available``.

    What a key cannot take (too few items) goes to the others, again in proportion to their weights.
    Integer counts come from largest remainders, ties broken by key, so the result is deterministic.
    """
    weights = weights or {}
    alloc = {k: 0 for k in available}
    active = {k for k, a in available.items() if a > 0 and weights.get(k, 1.0) > 0}
    remaining = min(total, sum(available[k] for k in active))
    while remaining > 0 and active:
        # fsum: the same total whatever order the set is walked in (a plain sum could differ in the last
        # bit between processes, as string hashing is salted, and flip a largest-remainder tie)
        wsum = math.fsum(weights.get(k, 1.0) for k in active)
        share = {k: remaining * weights.get(k, 1.0) / wsum for k in active}
        capped = sorted(k for k in active if alloc[k] + share[k] >= available[k])
        if capped:
            for k in capped:
                remaining -= available[k] - alloc[k]
                alloc[k] = available[k]
                active.discard(k)
            continue
        floors = {k: int(share[k]) for k in active}
        left = remaining - sum(floors.values())
        for k in sorted(active, key=lambda k: (-(share[k] - floors[k]), k))[:left]:
            floors[k] += 1
        for k in active:
            alloc[k] += floors[k]
        remaining = 0
    return alloc


def mix(
    candidates: Sequence[Candidate],
    n: int,
    seed: int = 0,
    category_weights: dict[str, float] | None = None,
    source_weights: dict[str, float] | None = None,
) -> tuple[list[Candidate], dict]:
    """Pick ``n`` candidates: categories by ``category_weights``, sources inside a category by weight.

    A category (or source) with too few candidates is filled from the others; the returned info dict says
    which. The output order is shuffled; everything depends only on ``seed`` and the candidates.
    """
    category_weights = category_weights if category_weights is not None else CATEGORY_WEIGHTS
    source_weights = source_weights if source_weights is not None else SOURCE_WEIGHTS
    by_cat: dict[str, dict[str, list[Candidate]]] = defaultdict(lambda: defaultdict(list))
    for c in candidates:
        if category_weights.get(c.category, 0) > 0:
            by_cat[c.category][c.source].append(c)
    cat_avail = {cat: sum(len(v) for v in srcs.values()) for cat, srcs in by_cat.items()}
    for cat in category_weights:
        cat_avail.setdefault(cat, 0)
    cat_quota = allocate(n, cat_avail, category_weights)
    wsum = sum(category_weights.values())
    info: dict = {"target": {}, "shortfall": {}, "filled_by": {}}
    for cat, w in category_weights.items():
        target = round(n * w / wsum)
        info["target"][cat] = target
        if cat_quota.get(cat, 0) < target:
            info["shortfall"][cat] = target - cat_quota.get(cat, 0)
        elif cat_quota.get(cat, 0) > target:
            info["filled_by"][cat] = cat_quota[cat] - target
    rng = random.Random(seed)
    picked: list[Candidate] = []
    for cat in sorted(by_cat):
        srcs = by_cat[cat]
        src_quota = allocate(cat_quota[cat], {s: len(v) for s, v in srcs.items()}, source_weights)
        for src in sorted(srcs):
            pool = sorted(srcs[src], key=lambda c: c.id)
            picked.extend(rng.sample(pool, src_quota[src]))
    rng.shuffle(picked)
    if len(picked) < n:
        info["short_by"] = n - len(picked)
    return picked, info


def summarize(picked: Sequence[Candidate]) -> dict:
    """Counts per category, per source, and per (category, source)."""
    per_cat = Counter(c.category for c in picked)
    per_src = Counter(c.source for c in picked)
    nested: dict[str, dict[str, int]] = defaultdict(dict)
    for (cat, src), k in sorted(Counter((c.category, c.source) for c in picked).items()):
        nested[cat][src] = k
    return {"total": len(picked), "per_category": dict(sorted(per_cat.items())),
            "per_source": dict(sorted(per_src.items())), "per_category_source": dict(nested)}


def select_prompts(
    candidates: Sequence[Candidate],
    n: int,
    seed: int = 0,
    bench_index: BenchIndex | None = None,
    show_progress: bool = False,
) -> tuple[list[Candidate], dict]:
    """Clean, dedupe, drop benchmark overlaps, then mix ``n`` prompts. Pure given the candidates."""
    cleaned, dropped = clean_candidates(candidates)
    overlapping: list[Candidate] = []
    if bench_index is not None:
        cleaned, overlapping = filter_overlaps(cleaned, bench_index, show_progress)
    picked, info = mix(cleaned, n, seed)
    summary = summarize(picked)
    summary.update(
        requested=n,
        seed=seed,
        available_per_category=dict(sorted(Counter(c.category for c in cleaned).items())),
        dropped=dict(dropped, bench_overlap=len(overlapping)),
        bench_overlap_examples=[c.id for c in overlapping[:20]],
        **info,
    )
    return picked, summary


def write_jsonl(path: Path, candidates: Iterable[Candidate]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w", encoding="utf-8") as f:
        for c in candidates:
            f.write(json.dumps(to_record(c), ensure_ascii=False) + "\n")
    tmp.replace(path)
