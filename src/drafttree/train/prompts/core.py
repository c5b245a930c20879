"""Records, seeded generators, the data files, text helpers and cleaning."""

from __future__ import annotations

import hashlib
import json
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from drafttree.train.prompts.engine import Scope, render

DATA_DIR = Path(__file__).resolve().parent / "data"
MAX_PROMPT_CHARS = 2500
MAX_PASSAGE_CHARS = 2000
MIN_PROMPT_CHARS = 15


def _freeze(value: Any) -> Any:
    """JSON arrays become tuples (read-only, and ``+``/``==`` work as in the original Python tuples)."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    return value


@cache
def load_data(name: str) -> dict:
    """One data file of ``data/`` (``name`` without ``.json``), arrays as tuples."""
    with open(DATA_DIR / f"{name}.json", encoding="utf-8") as f:
        return _freeze(json.load(f))


def fill_text(template: str, **values: Any) -> str:
    """Render a data template (``{name}`` fields, see :mod:`engine`) with the given values."""
    return render(template, Scope({}, None, values))


_SOURCES = load_data("sources")
CATEGORY_WEIGHTS: dict[str, float] = dict(_SOURCES["CATEGORY_WEIGHTS"])
SOURCE_WEIGHTS: dict[str, float] = dict(_SOURCES["SOURCE_WEIGHTS"])  # inside a category; 1.0 when not listed
PACKAGES: dict[str, str] = dict(_SOURCES["PACKAGES"])
BIGBENCH_VERSION: str = _SOURCES["BIGBENCH_VERSION"]  # opt-in only (see the package docstring)
# (source name, path under evals/registry/data/, category, mode); none of the math sets comes from GSM8K
EVALS_SETS: tuple[tuple[str, str, str, str], ...] = _SOURCES["EVALS_SETS"]
# Read only with include_bigbench=True (every BIG-bench task asks, by a canary, not to be trained on).
BIGBENCH_TASKS: tuple[str, ...] = tuple(s["task"] for s in _SOURCES["BIGBENCH_SOURCES"])


@dataclass(frozen=True)
class Candidate:
    """One possible training prompt: ``text`` is the single user turn; ``key`` says where it came from."""

    source: str
    category: str
    key: str
    text: str

    @property
    def id(self) -> str:
        """Stable id from the source and the prompt text (not from the position in any list)."""
        digest = hashlib.sha1(f"{self.source}\n{self.text}".encode()).hexdigest()[:16]
        return f"{self.source}:{digest}"


def to_record(c: Candidate) -> dict:
    """The JSONL object written for a candidate."""
    return {"id": c.id, "source": c.source, "category": c.category,
            "messages": [{"role": "user", "content": c.text}]}


def rng_for(seed: int, *parts: object) -> random.Random:
    """A generator that depends only on the seed and the item, not on the order items are built in."""
    return random.Random("|".join([str(seed), *map(str, parts)]))


# ---------------------------------------------------------------------------------------------- text

_WORD = re.compile(r"\w+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")


def normalize_text(text: str) -> str:
    """Case- and whitespace-insensitive form used for dedupe."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def word_tokens(text: str) -> list[str]:
    """Lower-cased word tokens (punctuation dropped) used for the overlap check."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).lower())


def is_english(text: str, min_ascii_letters: float = 0.9) -> bool:
    """True when nearly all letters are ASCII (rejects Chinese, Russian, ... prompts)."""
    if _CJK.search(text):
        return False
    letters = [ch for ch in text if ch.isalpha()]
    if not letters:
        return False
    return sum(ch.isascii() for ch in letters) / len(letters) >= min_ascii_letters


def cut_passage(text: str, limit: int = MAX_PASSAGE_CHARS) -> str:
    """Cut ``text`` to at most ``limit`` characters, at a sentence end when one is close enough."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = text[:limit]
    ends = [m.end() for m in re.finditer(r"[.!?][\"')\u201d\u2019]?(?=\s)|\n", head)]
    if ends and ends[-1] >= limit // 2:
        return head[: ends[-1]].strip()
    space = head.rfind(" ")
    return (head[:space] if space > limit // 2 else head).strip()


def cap_length(text: str, limit: int = MAX_PROMPT_CHARS, marker: str = "\n[...]\n") -> str:
    """Keep the head and the tail of an over-long prompt (the instruction is usually at one end)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    half = (limit - len(marker)) // 2
    head = text[:half]
    tail = text[-half:]
    cut = head.rfind(" ")
    if cut > half // 2:
        head = head[:cut]
    cut = tail.find(" ")
    if 0 <= cut < half // 2:
        tail = tail[cut + 1 :]
    return head.rstrip() + marker + tail.lstrip()


def clean_candidates(
    candidates: Iterable[Candidate],
    min_chars: int = MIN_PROMPT_CHARS,
    max_chars: int = MAX_PROMPT_CHARS,
) -> tuple[list[Candidate], Counter]:
    """Strip, drop empty / short / over-long / non-English prompts and exact duplicates (first one wins)."""
    kept: list[Candidate] = []
    seen_text: set[str] = set()
    seen_id: set[str] = set()
    dropped: Counter = Counter()
    for c in candidates:
        text = c.text.strip()
        if text != c.text:
            c = Candidate(c.source, c.category, c.key, text)
        if len(text) < min_chars or len(word_tokens(text)) < 3:
            dropped["too_short"] += 1
            continue
        if len(text) > max_chars:
            dropped["too_long"] += 1
            continue
        if "canary GUID" in text or not is_english(text):
            dropped["not_english"] += 1
            continue
        norm = normalize_text(text)
        if norm in seen_text or c.id in seen_id:
            dropped["duplicate"] += 1
            continue
        seen_text.add(norm)
        seen_id.add(c.id)
        kept.append(c)
    return kept, dropped
