"""Seeded prompts run from the data files: math word problems, chat requests, knowledge questions, code requests.

``data/word_problems.json``: ``lists`` shared by all problems (``NAMES_F``/``NAMES_M`` feed ``person()``,
``FRACTION_WORDS`` feeds ``fraction()``, ``MATH_OPENERS``/``MATH_CLOSERS`` wrap every problem), then
``problems``, each a ``name``, optional ``lists`` of its own (named after the variable they fill) and
``steps`` (see :mod:`.engine`). Every problem gets its own generator, seeded from the seed, its name and its
number, so adding a problem changes no other.

``data/chat.json``, ``knowledge.json``, ``code.json``: a ``source``, a ``category``, ``lists`` and
``sections``. A section makes one prompt per item of ``for`` (a comprehension head such as
``"i, s in enumerate(SITUATIONS)"``; no random draws there), or per item of ``each`` inside it (evaluated
per item, so it may draw). The text comes from ``steps``, the id key from the template ``key``. The random
generator: ``seed_each`` (a list of templates) seeds a new one per item from the seed, the source and those
parts; ``seed`` (a list of strings) seeds one at the start of the section that later sections go on using.
``"squash": true`` on the file folds runs of white space in every text.
"""

from __future__ import annotations

import ast
import random
from collections import ChainMap
from dataclasses import dataclass
from functools import cache
from typing import Any

from drafttree.train.prompts.core import Candidate, load_data, rng_for
from drafttree.train.prompts.engine import (
    Compiled,
    Scope,
    Step,
    TemplateError,
    compile_expression,
    compile_steps,
    compile_template,
    run_steps,
)


@dataclass(frozen=True, eq=False)
class WordProblem:
    """One word-problem template: ``problem(rng)`` is its text for that generator."""

    name: str
    data: ChainMap
    steps: tuple[Step, ...]

    def __call__(self, rng: random.Random) -> str:
        return run_steps(self.steps, Scope(self.data, rng))


def load_word_problems(name: str = "word_problems") -> tuple[WordProblem, ...]:
    data = load_data(name)
    return tuple(WordProblem(p["name"], ChainMap(dict(p.get("lists", {})), data["lists"]),
                             compile_steps(p["steps"], f"{name}.json: problem {p['name']!r}"))
                 for p in data["problems"])


WORD_PROBLEM_TEMPLATES = load_word_problems()


def build_word_problems(seed: int = 0, per_template: int = 60) -> list[Candidate]:
    """Seeded grade-school math word problems: many templates, names, items, numbers and phrasings."""
    lists = load_data("word_problems")["lists"]
    out = []
    for problem in WORD_PROBLEM_TEMPLATES:
        for j in range(per_template):
            rng = rng_for(seed, "word_problems", problem.name, j)
            text = " ".join(problem(rng).split()).replace("a.m..", "a.m.").replace("p.m..", "p.m.")
            opener, closer = rng.choice(lists["MATH_OPENERS"]), rng.choice(lists["MATH_CLOSERS"])
            out.append(Candidate("templates/math", "math", f"{problem.name}:{j}", f"{opener}{text}{closer}"))
    return out


# ---------------------------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class Section:
    names: tuple[str, ...]  # the loop variables of ``for``
    items: Compiled  # -> tuples of their values
    each: tuple[tuple[str, ...], Compiled] | None
    key: Compiled
    steps: tuple[Step, ...]
    seed: tuple[str, ...] | None
    seed_each: tuple[Compiled, ...] | None


def _loop(spec: str) -> tuple[tuple[str, ...], Compiled]:
    """``"i, s in enumerate(XS)"`` -> the variable names and an expression listing their value tuples."""
    try:
        comp = ast.parse(f"[0 for {spec}]", mode="eval").body
    except SyntaxError as e:
        raise TemplateError(f"bad loop {spec!r}: {e.msg}") from None
    names = tuple(dict.fromkeys(n.id for g in comp.generators for n in ast.walk(g.target)
                                if isinstance(n, ast.Name)))
    return names, compile_expression(f"[({', '.join(names)},) for {spec}]")


def _section(sec: dict, where: str) -> Section:
    try:
        names, items = _loop(sec["for"])
        each = _loop(sec["each"]) if "each" in sec else None
        seed_each = tuple(compile_template(p) for p in sec["seed_each"]) if "seed_each" in sec else None
        return Section(names, items, each, compile_template(sec["key"]), compile_steps(sec["steps"], where),
                       tuple(sec["seed"]) if "seed" in sec else None, seed_each)
    except KeyError as e:
        raise TemplateError(f"{where}: missing {e}") from None
    except TemplateError as e:
        raise TemplateError(f"{where}: {e}") from None


@cache
def load_sections(name: str) -> tuple[dict, tuple[Section, ...]]:
    data = load_data(name)
    return data, tuple(_section(s, f"{name}.json: section {s.get('key')!r}") for s in data["sections"])


def run_sections(name: str, seed: int = 0) -> list[Candidate]:
    """Every prompt of a data file of sections, in order."""
    data, sections = load_sections(name)
    source, category, squash = data["source"], data["category"], data.get("squash", False)
    rng: random.Random | None = None
    out = []
    for sec in sections:
        if sec.seed is not None:
            rng = rng_for(seed, source, *sec.seed)
        for values in sec.items(Scope(data["lists"])):
            item = Scope(data["lists"], rng, dict(zip(sec.names, values)))
            if sec.seed_each is not None:
                item.rng = rng_for(seed, source, *(p(item) for p in sec.seed_each))
            inner: Any = [()] if sec.each is None else sec.each[1](item)
            for inner_values in inner:
                scope = item.child(**dict(zip(sec.each[0], inner_values))) if sec.each else item.child()
                text = run_steps(sec.steps, scope)
                out.append(Candidate(source, category, sec.key(scope), " ".join(text.split()) if squash else text))
    return out


def build_chat_prompts(seed: int = 0) -> list[Candidate]:
    """Open-ended chat requests: advice, recommendations, planning, comparisons, opinions, role-play."""
    return run_sections("chat", seed)


def build_knowledge_questions(seed: int = 0) -> list[Candidate]:
    """Knowledge and reasoning questions: how things work, differences, whys, people, history, myths."""
    return run_sections("knowledge", seed)


def build_code_requests(seed: int = 0) -> list[Candidate]:
    """General programming requests: small tasks in several languages, concept questions, debugging."""
    return run_sections("code", seed)
