"""Fast tests of the training-prompt assembly: pure functions on in-memory fixtures, no downloads. The generated prompts
(code, summaries, word problems, templates) and their template engine: test_prompt_templates.py."""

from __future__ import annotations

import json
import random

import pytest

from drafttree.train import prompts as P
from drafttree.train.prompts import assemble as A

BENCH_QUESTIONS = [
    "Who played anna in once upon a time?",
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
    "and must-see attractions.",
    "Complete the code I provided.\n\ndef below_threshold(l: list, t: int):\n    \"\"\"Return True if all "
    "numbers in the list l are below threshold t.\n    \"\"\"\n",
    "Hi",
]


def _cands(category: str, source: str, k: int) -> list[P.Candidate]:
    return [P.Candidate(source, category, str(i), f"{source} prompt number {i} about {category} things")
            for i in range(k)]


def _pool() -> list[P.Candidate]:
    return (_cands("writing", "w1", 30) + _cands("writing", "w2", 30) + _cands("chat", "c1", 40)
            + _cands("qa", "q1", 40) + _cands("math", "m1", 40) + _cands("code", "k1", 60)
            + _cands("summarization", "s1", 30) + _cands("extraction", "e1", 5))


# ---- overlap check


def test_overlap_drops_exact_bench_question_case_and_whitespace_insensitive():
    index = P.BenchIndex(BENCH_QUESTIONS)
    cands = [
        P.Candidate("x", "qa", "0", "WHO played   Anna in once upon a time?"),
        P.Candidate("x", "qa", "1", "Who played Elsa in Frozen?"),
    ]
    kept, dropped = P.filter_overlaps(cands, index)
    assert [c.key for c in dropped] == ["0"]
    assert [c.key for c in kept] == ["1"]


def test_overlap_finds_short_question_inside_longer_prompt():
    index = P.BenchIndex(BENCH_QUESTIONS)
    assert index.overlaps("Quick quiz. Who played Anna in Once Upon a Time? Answer briefly.")
    assert not index.overlaps("Who played in the band Anna and the Time?")


def test_overlap_long_shared_substring():
    index = P.BenchIndex(BENCH_QUESTIONS)
    text = ("Please help me. Compose an engaging travel blog post about a recent trip to Hawaii, "
            "highlighting the food.")
    assert index.overlaps(text)
    code = ("Implement this:\ndef below_threshold(l: list, t: int):\n    '''Return True if all numbers "
            "in the list l are below threshold t.'''")
    assert index.overlaps(code)
    assert not index.overlaps("Write a travel blog post about a trip to Iceland and its hot springs.")


def test_very_short_bench_question_only_matches_exactly():
    index = P.BenchIndex(BENCH_QUESTIONS)
    assert index.overlaps("hi")
    assert not index.overlaps("Hi there, how are you today?")


def test_read_bench_questions(tmp_path):
    rows = [{"question_id": 1, "category": "writing", "turns": ["First turn?", "Second turn."]},
            {"question_id": 2, "category": "qa", "turns": ["Another question here?"]}]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert P.read_bench_questions([tmp_path]) == ["First turn?", "Second turn.", "Another question here?"]


# ---- cleaning


def test_clean_drops_short_long_nonenglish_and_duplicates():
    cands = [
        P.Candidate("s", "chat", "0", "  Hello there, how are you doing today?  "),
        P.Candidate("s", "chat", "1", "hello there,   HOW are you doing today?"),
        P.Candidate("s", "chat", "2", "ok"),
        P.Candidate("s", "chat", "3", "x " * 2000),
        P.Candidate("s", "chat", "4", "请帮我写一篇关于机器学习的论文大纲，谢谢你的帮助"),
        P.Candidate("s", "chat", "5", "Напишите короткое стихотворение о весне и любви"),
    ]
    kept, dropped = P.clean_candidates(cands)
    assert [c.key for c in kept] == ["0"]
    assert kept[0].text == "Hello there, how are you doing today?"
    assert dropped["duplicate"] == 1 and dropped["too_long"] == 1
    assert sum(dropped.values()) == 5  # the Chinese one counts as one word, hence "too_short"


def test_cut_passage_and_cap_length():
    passage = " ".join(f"Sentence number {i} is here." for i in range(200))
    cut = P.cut_passage(passage, 500)
    assert len(cut) <= 500 and cut.endswith(".")
    long = "Instruction at the start. " + "filler " * 1000 + "Question at the end?"
    capped = P.cap_length(long, 2500)
    assert len(capped) <= 2500
    assert capped.startswith("Instruction at the start.") and capped.endswith("Question at the end?")
    assert P.cap_length("short", 2500) == "short"


# ---- allocation and mixing


def test_allocate_proportional_and_fills_shortfall():
    assert P.allocate(100, {"a": 1000, "b": 1000}, {"a": 3, "b": 1}) == {"a": 75, "b": 25}
    # "b" has only 10: the rest goes to "a" and "c" by weight
    alloc = P.allocate(100, {"a": 1000, "b": 10, "c": 1000}, {"a": 1, "b": 1, "c": 1})
    assert alloc["b"] == 10 and sum(alloc.values()) == 100 and abs(alloc["a"] - alloc["c"]) <= 1
    # never more than available in total
    assert P.allocate(50, {"a": 5, "b": 7}) == {"a": 5, "b": 7}
    assert P.allocate(10, {"a": 0, "b": 100}) == {"a": 0, "b": 10}


def test_allocate_does_not_depend_on_set_order():
    # a real case (seed 1, 3000 prompts, the "qa" category) where a plain float sum over the set of active
    # sources depended on the salted string hashes; renaming the keys reorders the set, not the sorted keys
    avail = {"inspect_evals/freshqa": 601, "evals/logiqa": 1205, "evals/medmcqa": 300, "evals/us_tort_law": 340,
             "evals/cissp": 143, "evals/test_comp_sci": 38, "evals/emotional-intelligence": 100,
             "evals/moral_exceptQA": 148, "evals/ambiguous-sentences": 60, "evals/quartz": 3856,
             "evals/socialiqa": 2218, "evals/crepe": 1520, "evals/born_first": 113, "evals/which_is_heavier": 183,
             "evals/premature-conclusions": 15, "evals/logic-riddles": 47, "evals/unsolvable_questions": 299,
             "templates/knowledge": 282}
    base = P.allocate(450, avail, P.SOURCE_WEIGHTS)
    assert base["evals/logiqa"] == 38 and base["evals/socialiqa"] == 22
    for i in range(40):
        pre = f"p{i}/"
        got = P.allocate(450, {pre + k: v for k, v in avail.items()},
                         {pre + k: w for k, w in P.SOURCE_WEIGHTS.items()})
        assert {k[len(pre):]: v for k, v in got.items()} == base


def test_mix_category_quotas():
    picked, info = P.mix(_pool(), 100, seed=0)
    cats = {cat: sum(c.category == cat for c in picked) for cat in P.CATEGORY_WEIGHTS}
    assert len(picked) == 100
    assert cats == {"writing": 20, "chat": 15, "qa": 15, "math": 15, "code": 20, "summarization": 10,
                    "extraction": 5}
    assert info["shortfall"] == {}
    # both writing sources are used
    assert {c.source for c in picked if c.category == "writing"} == {"w1", "w2"}


def test_mix_fills_short_category_from_others():
    pool = [c for c in _pool() if c.category != "extraction"] + _cands("extraction", "e1", 2)
    picked, info = P.mix(pool, 100, seed=0)
    assert len(picked) == 100
    assert sum(c.category == "extraction" for c in picked) == 2
    assert info["shortfall"] == {"extraction": 3}
    assert sum(info["filled_by"].values()) == 3


def test_mix_deterministic_and_seed_dependent():
    a, _ = P.mix(_pool(), 80, seed=1)
    b, _ = P.mix(list(reversed(_pool())), 80, seed=1)
    c, _ = P.mix(_pool(), 80, seed=2)
    assert [x.id for x in a] == [x.id for x in b]
    assert [x.id for x in a] != [x.id for x in c]
    assert len({x.id for x in a}) == 80


def test_mix_not_enough_candidates():
    picked, info = P.mix(_cands("chat", "c1", 10), 50, seed=0)
    assert len(picked) == 10 and info["short_by"] == 40


def test_select_prompts_end_to_end():
    pool = _pool() + [P.Candidate("q2", "qa", "x", "Who played Anna in Once Upon a Time?")]
    picked, summary = P.select_prompts(pool, 60, seed=0, bench_index=P.BenchIndex(BENCH_QUESTIONS))
    assert summary["dropped"]["bench_overlap"] == 1
    assert summary["bench_overlap_examples"] == [pool[-1].id]
    assert summary["total"] == 60 and sum(summary["per_category"].values()) == 60
    assert all(c.source != "q2" for c in picked)


# ---- ids


def test_ids_come_from_source_and_text_not_position():
    a = P.Candidate("src", "qa", "0", "What is the capital of Peru?")
    assert a.id.startswith("src:") and len(a.id) == len("src:") + 16
    assert P.Candidate("src", "qa", "99", "What is the capital of Peru?").id == a.id
    assert P.Candidate("other", "qa", "0", "What is the capital of Peru?").id != a.id
    assert P.Candidate("src", "qa", "0", "What is the capital of Chile?").id != a.id
    # stripping whitespace during cleaning gives the id of the stripped text
    kept, _ = P.clean_candidates([P.Candidate("src", "qa", "0", "  What is the capital of Peru?  ")])
    assert kept[0].id == a.id


def test_mix_ids_do_not_depend_on_input_order():
    pool = _pool()
    shuffled = list(pool)
    random.Random(3).shuffle(shuffled)
    a, _ = P.mix(pool, 70, seed=4)
    b, _ = P.mix(shuffled, 70, seed=4)
    assert [x.id for x in a] == [x.id for x in b]


# ---- output format


def test_write_jsonl_format(tmp_path):
    picked, _ = P.mix(_pool(), 20, seed=0)
    out = tmp_path / "sub" / "prompts.jsonl"
    P.write_jsonl(out, picked)
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 20
    for row in rows:
        assert set(row) == {"id", "source", "category", "messages"}
        assert all(isinstance(row[k], str) for k in ("id", "source", "category"))
        assert row["category"] in P.CATEGORY_WEIGHTS
        assert len(row["messages"]) == 1 and row["messages"][0]["role"] == "user"
        assert isinstance(row["messages"][0]["content"], str) and row["messages"][0]["content"]
    assert len({r["id"] for r in rows}) == 20


# ---- builders


def test_build_writingbench_keeps_english_and_caps():
    rows = [{"index": "1", "query": "请写一篇文章"}, {"index": "2", "query": "Write a memo. " * 400},
            {"index": "3", "query": "Write a short poem about autumn leaves."}]
    out = P.build_writingbench(rows)
    assert [c.key for c in out] == ["2", "3"]
    assert len(out[0].text) <= P.MAX_PROMPT_CHARS and out[0].category == "writing"


def test_build_freshqa_skips_preamble():
    csv_text = ("Warning: do not click,,\n,,\nid,split,question,answer_0\n"
                "0,TEST,What is the tallest mountain?,Everest\n1,TEST,,x\n")
    out = P.build_freshqa([csv_text])
    assert [c.text for c in out] == ["What is the tallest mountain?"]


def test_evals_prompt_modes():
    rec = {"input": [{"role": "system", "content": "Answer with a single number."},
                     {"role": "user", "content": "Tom has 3 apples and buys 4 more. How many now?"}]}
    rng = random.Random(0)
    assert P.evals_prompt(rec, "user", rng) == "Tom has 3 apples and buys 4 more. How many now?"
    assert P.evals_prompt(rec, "sys+user", rng).startswith("Answer with a single number.\n\nTom")
    assert P.evals_prompt(rec, "mcq", rng).endswith("How many now?")
    assert P.evals_prompt({"input": [{"role": "system", "content": "only system"}]}, "user", rng) is None
    moral = {"input": [{"role": "user", "content": "Is this acceptable? \nYes\nNo\nAnswer:"}]}
    assert P.evals_prompt(moral, "user", rng) == "Is this acceptable?"


def test_build_topical_chat_last_utterance():
    examples = [
        {"input": 'agent_A: "Are you a big football fan?"', "comment": "c1"},
        {"input": 'agent_B: "Are you a big football fan?" agent_A: "Yes I am, did you know the locker '
                  'room is painted pink?"', "comment": "c1"},
        {"input": 'agent_A: "Hi there"', "comment": "c2"},
    ]
    out = P.build_topical_chat(examples, per_conversation=2)
    texts = {c.text for c in out}
    assert texts == {"Are you a big football fan?", "Yes I am, did you know the locker room is painted pink?"}
    assert all(c.category == "chat" for c in out)


def test_evals_prompt_clean_sys_and_context_modes():
    rng = random.Random(0)
    rec = {"input": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "Was Abraham Lincoln born before Franklin Pierce? Answer Y or N."}]}
    assert P.evals_prompt(rec, "clean", rng) == "Was Abraham Lincoln born before Franklin Pierce?"
    rec = {"input": [{"role": "user", "content": "What is the husband's age? Please give only the numerical "
                      "answer as a single integer indicating the number of years. Do not give any reasoning "
                      "or logic for your answer."}]}
    assert P.evals_prompt(rec, "clean", rng) == "What is the husband's age?"
    assert P.strip_answer_format("How many? Put your final answer inside brackets([]).") == "How many?"
    riddle = {"input": [{"role": "system", "content": "Solve this riddle: who owns the zebra?"}]}
    assert P.evals_prompt(riddle, "sys", rng) == "Solve this riddle: who owns the zebra?"
    ctx = {"input": [{"role": "user", "content": "Question: When was the church founded?\n Context: The "
                      "church was founded in 1795 by settlers."}]}
    for seed in range(6):
        text = P.evals_prompt(ctx, "ctxq", random.Random(seed))
        assert "The church was founded in 1795 by settlers." in text
        assert "church founded?" in text and "Context:" not in text


def test_clean_mathqa():
    s = P.clean_mathqa("sophia finished 2 / 3 of a book . she read 90 more pages , how long is it ?")
    assert s == "Sophia finished 2/3 of a book. She read 90 more pages, how long is it?"
    s = P.clean_mathqa("a tax of 40 % on $ 45000 is 3 . 5 times x .")
    assert s == "A tax of 40% on $45000 is 3.5 times x."


def test_bigbench_is_off_by_default(tmp_path, monkeypatch):
    calls = []

    def offline(*args, **kwargs):
        raise RuntimeError("offline")

    def bigbench(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("no bigbench here")

    monkeypatch.setattr(A, "fetch_package", offline)
    monkeypatch.setattr(A, "fetch_bigbench", bigbench)
    monkeypatch.setattr(A, "stdlib_functions", lambda show_progress=True: [])
    with pytest.warns(UserWarning):
        cands, notes = P.collect_candidates(tmp_path, seed=0, show_progress=False)
    assert calls == []
    assert cands and not any(c.source.startswith("bigbench") for c in cands)
    assert {c.category for c in cands} >= {"math", "chat", "qa", "code"}
    assert not any("bigbench" in n.lower() for n in notes)
    with pytest.warns(UserWarning):
        _, notes = P.collect_candidates(tmp_path, seed=0, show_progress=False, include_bigbench=True)
    assert len(calls) == 1
    assert any("canary" in n for n in notes)


def test_cli_include_bigbench_flag(monkeypatch, tmp_path):
    seen = {}

    def fake(*args, **kwargs):
        seen.update(kwargs)
        return {}

    from drafttree.cli import main

    monkeypatch.setattr(P, "assemble_prompts", fake)
    assert main(["data", "prompts", "--out", str(tmp_path / "p.jsonl"), "--quiet"]) == 0
    assert seen["include_bigbench"] is False
    main(["data", "prompts", "--out", str(tmp_path / "p.jsonl"), "--quiet", "--include-bigbench"])
    assert seen["include_bigbench"] is True


def test_cli_passes_every_prompts_option(monkeypatch, tmp_path):
    from drafttree.cli import main

    seen = {}
    monkeypatch.setattr(P, "assemble_prompts", lambda *args, **kwargs: seen.update(args=args, **kwargs) or {})
    main(["data", "prompts", "--out", "o.jsonl", "--n", "12", "--seed", "3", "--sources-dir", "src-dir",
          "--bench-dir", "bench-dir"])
    assert seen == {"args": ("o.jsonl", 12), "seed": 3, "sources_dir": "src-dir", "bench_dir": "bench-dir",
                    "show_progress": True, "include_bigbench": False}


@pytest.mark.parametrize("text,expected", [("Hello world, fine.", True), ("你好世界", False), ("", False)])
def test_is_english(text, expected):
    assert P.is_english(text) is expected


# ---- archive readers (local files only)


def test_read_bigbench_from_sdist_and_zip(tmp_path):
    import io
    import tarfile
    import zipfile

    task = json.dumps({"examples": [{"input": "Some sentence here. \nKeyword: how"}]}).encode()
    sdist = tmp_path / "bigbench-1.0.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        info = tarfile.TarInfo("bigbench-1.0.0/bigbench/benchmark_tasks/rephrase/task.json")
        info.size = len(task)
        tf.addfile(info, io.BytesIO(task))
    assert P.read_bigbench(sdist, show_progress=False) == {"rephrase/task.json": json.loads(task)}
    subset = tmp_path / P.BIGBENCH_SUBSET
    with zipfile.ZipFile(subset, "w") as zf:
        zf.writestr("bigbench/benchmark_tasks/rephrase/task.json", task)
    assert P.read_bigbench(subset, show_progress=False) == {"rephrase/task.json": json.loads(task)}


def test_find_archive(tmp_path):
    from drafttree.train.prompts.sources import _find_archive

    (tmp_path / "inspect_evals-0.26.0-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "evals-3.0.1.post1-py3-none-any.whl").write_bytes(b"")
    assert _find_archive(tmp_path, "inspect-evals", "0.26.0").name.startswith("inspect_evals-0.26.0")
    assert _find_archive(tmp_path, "evals", "3.0.1.post1").name.startswith("evals-3.0.1")
    assert _find_archive(tmp_path, "evals", "3.0.2") is None
    assert _find_archive(tmp_path / "missing", "evals", "3.0.1.post1") is None


# ---- the template language and the data files
