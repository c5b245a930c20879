"""Builders: already-loaded source records -> candidates (pure functions; wording from ``data/``)."""

from __future__ import annotations

import csv
import io
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

from drafttree.train.prompts.core import (
    Candidate,
    cap_length,
    cut_passage,
    fill_text,
    is_english,
    load_data,
    rng_for,
)

_SRC = load_data("sources")
_W = load_data("writing")
GRIM_NOUNS = frozenset(_W["GRIM_NOUNS"])  # nouns of the lexicon kept out of writing prompts


def build_writingbench(rows: Iterable[dict]) -> list[Candidate]:
    """WritingBench rows (``index``, ``query``): English queries, long ones cut to head + tail."""
    out = []
    for row in rows:
        q = str(row.get("query", ""))
        if is_english(q):
            out.append(Candidate("inspect_evals/writingbench", "writing", str(row.get("index")), cap_length(q)))
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


# ---------------------------------------------------------------------------------------------- evals records


def messages(record: dict) -> list[dict]:
    """The chat turns of an ``evals`` record (a plain string input is one user turn)."""
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
    """Turn one chat-format ``evals`` record into a single user prompt, or None when it has none.

    Modes: "user" = the last user turn; "clean" = the same without answer-format demands; "mcq" = the last
    user turn behind a varied "answer and explain" instruction; "sys+user" = the system instruction then the
    last user turn; "sys" = the system turn; "ctxq" = a "Question: ... Context: ..." turn rewritten as passage
    + question; "loop", "css" = dataset-specific wording.
    """
    msgs = messages(record)
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
        return fill_text(rng.choice(_SRC["CONTEXT_QUESTION_TEMPLATES"]), q=q, ctx=ctx)
    if mode == "mcq":
        instr = rng.choice(_SRC["MCQ_INSTRUCTIONS"])
        return f"{instr}\n\n{user}" if instr else user
    if mode == "sys+user":
        return f"{system}\n\n{user}" if system else user
    if mode == "loop":
        if re.search(r"\b\w \w \w \w\b", user):  # text garbled by PDF extraction ("r e t u r n")
            return None
        return f"{rng.choice(_SRC['LOOP_ASKS'])}\n\n```\n{user}\n```"
    if mode == "css":
        return fill_text(_SRC["CSS_TEMPLATE"], task=user.rstrip("."))
    raise ValueError(f"unknown evals mode {mode!r}")


def build_evals_set(name: str, category: str, mode: str, records: Iterable[dict], seed: int = 0
                    ) -> list[Candidate]:
    """One ``evals`` registry file (list of parsed JSON lines) -> candidates."""
    out = []
    source = f"evals/{name}"
    for i, rec in enumerate(records):
        text = evals_prompt(rec, mode, rng_for(seed, source, i))
        if text:
            out.append(Candidate(source, category, str(i), cap_length(text)))
    return out


# ---------------------------------------------------------------------------------------------- passages


def _passage_candidates(source: str, category: str, passages: Iterable[tuple[str, str]], seed: int,
                        instructions: Sequence[str], min_chars: int = 300) -> list[Candidate]:
    out = []
    for key, passage in passages:
        passage = cut_passage(passage)
        if len(passage) < min_chars:
            continue
        instr = rng_for(seed, source, key).choice(instructions)
        text = fill_text(instr, passage=passage) if "{passage}" in instr else f"{instr}\n\n{passage}"
        out.append(Candidate(source, category, key, text))
    return out


def build_summaries(source: str, passages: Iterable[tuple[str, str]], seed: int = 0) -> list[Candidate]:
    """``(key, passage)`` pairs -> "summarize this" prompts (passages cut to ~2000 characters)."""
    return _passage_candidates(source, "summarization", passages, seed, _W["SUMMARY_INSTRUCTIONS"])


def build_abstract_summaries(passages: Iterable[tuple[str, str]], seed: int = 0) -> list[Candidate]:
    """``(key, abstract)`` pairs -> plain-language summary requests."""
    return _passage_candidates("evals/abstracts", "summarization", passages, seed, _W["ABSTRACT_INSTRUCTIONS"])


def build_rewrites(passages: Iterable[tuple[str, str]], seed: int = 0) -> list[Candidate]:
    """``(key, passage)`` pairs -> extraction / rewriting prompts."""
    return _passage_candidates("templates/rewrite", "extraction", passages, seed, _W["REWRITE_INSTRUCTIONS"])


# ---------------------------------------------------------------------------------------------- writing


def looks_concrete(noun: str) -> bool:
    """Crude guess that a common noun names a thing rather than an idea (no abstract-noun suffix)."""
    return noun.isalpha() and not noun.lower().endswith(_W["ABSTRACT_SUFFIXES"])


def build_writing_templates(nouns: Sequence[str], quotes: Sequence[str], seed: int = 0) -> list[Candidate]:
    """Writing and roleplay prompts: varied templates filled with real nouns and quotes."""
    out = []
    nouns = [n for n in nouns if n.strip() and n.lower() not in GRIM_NOUNS]
    for i, noun in enumerate(sorted(set(nouns))):
        rng = rng_for(seed, "writing", noun)
        x = f"the {noun}" if rng.random() < 0.6 and not noun[:1].isupper() else noun
        if i % 3 == 2:
            role, task, opener = rng.choice(_W["ROLES"]), rng.choice(_W["ROLE_TASKS"]), rng.choice(_W["ROLE_OPENERS"])
            task = fill_text(task, x=noun if noun[:1].isupper() else f"the {noun}")
            out.append(Candidate("templates/roleplay", "writing", noun, f"{fill_text(opener, r=role)} {task}"))
        else:
            templates = _W["WRITING_TEMPLATES"] + (_W["OBJECT_TEMPLATES"] if looks_concrete(noun) else ())
            out.append(Candidate("templates/writing", "writing", noun, fill_text(rng.choice(templates), x=x, n=noun)))
    for i, q in enumerate(quotes):
        template = rng_for(seed, "quote", i).choice(_W["QUOTE_TEMPLATES"])
        out.append(Candidate("templates/quotes", "writing", str(i), fill_text(template, q=q.strip())))
    return out


def build_concept_sets(nouns: Sequence[str], seed: int = 0, count: int = 600) -> list[Candidate]:
    """Writing prompts built around a small set of words (common nouns plus, often, a verb)."""
    pool = sorted({n for n in nouns if n.islower() and looks_concrete(n) and n not in GRIM_NOUNS})
    if len(pool) < 4:
        return []
    out = []
    for i in range(count):
        rng = rng_for(seed, "concepts", i)
        words = rng.sample(pool, rng.choice((2, 3, 3, 4)))
        if rng.random() < 0.6:
            words.insert(rng.randrange(len(words) + 1), rng.choice(_W["CONCEPT_VERBS"]))
        w = ", ".join(words[:-1]) + " and " + words[-1]
        text = fill_text(rng.choice(_W["CONCEPT_TEMPLATES"]), w=w)
        out.append(Candidate("templates/concepts", "writing", str(i), text))
    return out


# ---------------------------------------------------------------------------------------------- BIG-bench (opt-in)

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
        rng = rng_for(seed, "topical_chat", conv)
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


def build_mathqa(examples: Iterable[dict], seed: int = 0) -> list[Candidate]:
    """BIG-bench elementary_math_qa (MathQA word problems), answer choices left out."""
    out = []
    for i, ex in enumerate(examples):
        q = clean_mathqa(ex.get("input", ""))
        if q:
            q += rng_for(seed, "mathqa", i).choice(_W["MATH_SUFFIXES"])
            out.append(Candidate("bigbench/elementary_math_qa", "math", str(i), q))
    return out


def build_bigbench_questions(name: str, category: str, examples: Iterable[dict], field: str = "input",
                             template: str = "{q}") -> list[Candidate]:
    """Plain question tasks: the question text, possibly wrapped in a template."""
    out = []
    for i, ex in enumerate(examples):
        q = str(ex.get(field, "")).strip()
        if q:
            out.append(Candidate(f"bigbench/{name}", category, str(i), fill_text(template, q=q)))
    return out


def build_common_gen(examples: Iterable[dict], seed: int = 0) -> list[Candidate]:
    out = []
    for i, ex in enumerate(examples):
        words = ex.get("input", "").split()
        if len(words) >= 3:
            tpl = rng_for(seed, "common_gen", i).choice(_W["COMMON_GEN_TEMPLATES"])
            out.append(Candidate("bigbench/common_gen", "writing", str(i), fill_text(tpl, w=", ".join(words))))
    return out
