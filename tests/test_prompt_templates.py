"""The generated training prompts (train/prompts/generated.py) and the template engine that draws them from data files
(train/prompts/engine.py): pure functions, no downloads."""

from __future__ import annotations

import random
import re

import pytest

from drafttree.train import prompts as P
from drafttree.train.prompts import engine as E
from drafttree.train.prompts import generated as G

SAMPLE_MODULE = '''
def add(a, b):
    """Return the sum of a and b, which must both be numbers."""
    total = a + b
    return total


def undocumented(x):
    return x


class Box:
    def area(self, scale=1):
        """Area of the box, multiplied by ``scale`` for convenience."""
        w = self.w * scale
        return w * self.h * scale
'''


def test_extract_functions_and_code_prompts():
    fns = P.extract_functions(SAMPLE_MODULE, "mod")
    assert [f.qualname for f in fns] == ["add", "Box.area"]
    add = fns[0]
    assert add.stub.startswith("def add(a, b):") and add.stub.rstrip().endswith('"""')
    assert "return total" not in add.stub and "return total" in add.full
    assert '"""' not in add.no_doc and "return total" in add.no_doc
    cands = P.build_code_prompts(fns, seed=0)
    assert {c.key for c in cands} == {"mod.add", "mod.Box.area"}
    assert all(c.category == "code" and c.source == "stdlib" for c in cands)
    again = P.build_code_prompts(fns, seed=0)
    assert [c.text for c in cands] == [c.text for c in again]


def test_code_prompt_variety():
    fn = P.extract_functions(SAMPLE_MODULE, "mod")[0]
    texts = {P.code_prompt(fn, random.Random(i)) for i in range(60)}
    assert len(texts) > 20
    assert any("def add(a, b):" in t and "return total" not in t for t in texts)  # implement tasks
    assert any("return total" in t for t in texts)  # explain / review tasks


def test_summaries_and_templates():
    passage = "The river flooded the town after three days of rain. " * 60
    out = P.build_summaries("src", [("a", passage), ("b", "too short")], seed=0)
    assert [c.key for c in out] == ["a"]
    assert len(out[0].text) <= P.MAX_PASSAGE_CHARS + 100 and out[0].category == "summarization"
    rw = P.build_rewrites([("a", passage)], seed=0)
    assert rw[0].category == "extraction"
    nouns = ["lighthouse", "umbrella", "violin"]
    tpl = P.build_writing_templates(nouns, ["\u201cStay hungry.\u201d"], seed=0)
    assert {c.category for c in tpl} == {"writing"}
    assert {c.source for c in tpl} == {"templates/writing", "templates/roleplay", "templates/quotes"}
    assert P.build_writing_templates(nouns, [], seed=0) == P.build_writing_templates(nouns, [], seed=0)


def test_word_problems_deterministic_varied_and_question_like():
    a = P.build_word_problems(seed=0, per_template=8)
    b = P.build_word_problems(seed=0, per_template=8)
    c = P.build_word_problems(seed=1, per_template=8)
    assert [x.text for x in a] == [x.text for x in b]
    assert [x.text for x in a] != [x.text for x in c]
    assert len(P.WORD_PROBLEM_TEMPLATES) >= 40
    assert len(a) == 8 * len(P.WORD_PROBLEM_TEMPLATES)
    assert len({x.text for x in a}) > 0.95 * len(a)
    assert {x.category for x in a} == {"math"} and {x.source for x in a} == {"templates/math"}
    for x in a:
        assert "?" in x.text, x.text
        assert "{" not in x.text and "  " not in x.text and ".." not in x.text and " a a" not in x.text
    # many different people and numbers
    lists = P.load_data("word_problems")["lists"]
    names = {n for x in a for n in lists["NAMES_F"] + lists["NAMES_M"] if n in x.text}
    assert len(names) > 30


def test_every_word_problem_template_runs_for_many_seeds():
    for tpl in P.WORD_PROBLEM_TEMPLATES:
        texts = {tpl(random.Random(s)) for s in range(60)}
        assert len(texts) > 30, tpl.name


def test_chat_knowledge_and_code_templates():
    chat = P.build_chat_prompts(seed=0)
    know = P.build_knowledge_questions(seed=0)
    code = P.build_code_requests(seed=0)
    assert len(chat) > 500 and {c.category for c in chat} == {"chat"}
    assert len(know) > 200 and {c.category for c in know} == {"qa"}
    assert len(code) > 100 and {c.category for c in code} == {"code"}
    for group in (chat, know, code):
        assert len({c.text for c in group}) == len(group)
        assert all("{" not in c.text or "```" in c.text for c in group)
    assert [c.text for c in chat] == [c.text for c in P.build_chat_prompts(seed=0)]
    assert [c.text for c in chat] != [c.text for c in P.build_chat_prompts(seed=1)]
    assert any("role-play" in c.text.lower() for c in chat)


def test_concept_sets_and_code_lines():
    nouns = ["lighthouse", "umbrella", "violin", "garden", "kettle", "murder", "information", "Paris"]
    sets = P.build_concept_sets(nouns, seed=0, count=30)
    assert len(sets) == 30 and {c.source for c in sets} == {"templates/concepts"}
    assert not any("murder" in c.text or "information" in c.text or "Paris" in c.text for c in sets)
    assert sets == P.build_concept_sets(nouns, seed=0, count=30)
    src = "def f(xs):\n    \"\"\"Return the squares of the even items of xs.\"\"\"\n    y = 1\n" \
          "    return [x * x for x in xs if x % 2 == 0]\n"
    lines = P.build_code_line_prompts(P.extract_functions(src, "mod"), seed=0)
    assert len(lines) == 1 and "return [x * x for x in xs if x % 2 == 0]" in lines[0].text


def test_data_files_load_and_compile():
    assert len(P.WORD_PROBLEM_TEMPLATES) == len(P.load_data("word_problems")["problems"])
    assert len({t.name for t in P.WORD_PROBLEM_TEMPLATES}) == len(P.WORD_PROBLEM_TEMPLATES)
    for name in ("chat", "knowledge", "code"):
        data, sections = G.load_sections(name)
        assert sections and data["source"].startswith("templates/") and data["category"] in P.CATEGORY_WEIGHTS
    assert set(P.CATEGORY_WEIGHTS) == {"writing", "chat", "qa", "math", "code", "summarization", "extraction"}
    assert all(c in P.CATEGORY_WEIGHTS for _, _, c, _ in P.EVALS_SETS)
    assert len(P.BIGBENCH_TASKS) == 13 and P.BIGBENCH_SUBSET == "bigbench-1.0.0-tasks.zip"
    writing = P.load_data("writing")
    assert "murder" in P.GRIM_NOUNS and writing["WRITING_TEMPLATES"] and writing["SUMMARY_INSTRUCTIONS"]
    assert isinstance(writing["ROLES"], tuple)  # arrays are read-only tuples


@pytest.mark.parametrize("template,message", [
    ("Hello {name", "unclosed '{'"),
    ("Hello name}", "single '}'"),
    ("Hello {}", "empty field"),
    ("{x +}", "bad expression"),
    ("{__import__('os').system('true')}", "not allowed"),
    ("{p.__class__}", "attribute .__class__ is not allowed"),
    ("{text.upper()}", "not allowed"),
    ("{(lambda: 1)()}", "not allowed"),
    ("{x ** 2}", "operator Pow is not allowed"),
    ("{x!r}", "bad expression"),
    ("{f'{x!r}'}", "conversions are not allowed"),
])
def test_engine_rejects_malformed_templates(template, message):
    with pytest.raises(P.TemplateError, match=re.escape(message)):
        E.compile_template(template)


def test_engine_rejects_malformed_steps_with_their_place():
    with pytest.raises(P.TemplateError, match=r"bad\.json, step 2: .*'sai'"):
        E.compile_steps([{"let": {"x": "randint(1, 3)"}}, {"sai": "x is {x}"}], "bad.json")
    with pytest.raises(P.TemplateError, match=r"bad\.json, step 1: in expression 'open\(x\)'"):
        E.compile_steps([{"let": {"y": "open(x)"}, "say": "{y}"}], "bad.json")
    with pytest.raises(P.TemplateError, match="last step must be an unconditional 'say'"):
        E.compile_steps([{"if": "random() < 0.5", "say": "maybe"}], "bad.json")
    with pytest.raises(P.TemplateError, match="cannot assign to x\\[0\\]"):
        E.compile_steps([{"let": {"x[0]": "1"}, "say": "{x}"}], "bad.json")
    with pytest.raises(P.TemplateError, match="unknown name 'nope'"):
        E.render("{nope}", E.Scope({}))
    with pytest.raises(P.TemplateError, match="no random generator"):
        E.render("{choice(XS)}", E.Scope({"XS": (1, 2)}))


def test_engine_draws_in_written_order():
    steps = E.compile_steps([
        {"let": {"a, b": "randint(1, 9), choice(XS)", "c": "b if a > 100 else randint(1, 9)"}},
        {"if": "a > 100", "say": "never {choice(XS)}"},
        {"say": ["{a}-{b}-{c}-{money(a * 1.5)}", "{c}+{choice(XS)}:{num(a / 4)}{'!' if a > 4 else ''}"]},
    ], "test")
    for seed in range(20):
        rng = random.Random(seed)
        a, b = rng.randint(1, 9), rng.choice("xyz")
        c = rng.randint(1, 9)
        texts = (f"{a}-{b}-{c}-${a * 1.5:,.2f}".replace(".00", ""),
                 f"{c}+{rng.choice('xyz')}:{a / 4:g}{'!' if a > 4 else ''}")
        assert E.run_steps(steps, E.Scope({"XS": "xyz"}, random.Random(seed))) == rng.choice(texts)
