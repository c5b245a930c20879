"""drafttree bench: task files, metrics math, resume, report rendering, and one tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drafttree.bench import metrics as M
from drafttree.bench import runner as R
from drafttree.bench.report import render_report, write_outputs
from drafttree.bench.tasks import QUESTIONS_DIR, VENDORED, load_task, load_tasks, read_questions
from drafttree.errors import DraftTreeError

# ------------------------------------------------------------------------------------------------ tasks


def test_vendored_question_files():
    for name in VENDORED:
        task = load_task(name)
        assert len(task.questions) == (12 if name == "json" else 80), name
        assert all(q.turns and all(isinstance(t, str) for t in q.turns) for q in task.questions)
    assert all(set(q.constraint) == {"json_schema"} for q in load_task("json").questions)
    assert load_task("gsm8k").questions[0].constraint is None
    assert {len(q.turns) for q in load_task("mt_bench").questions} == {2}
    assert not (QUESTIONS_DIR / "alpaca.jsonl").exists()  # CC BY-NC: must not ship
    readme = (QUESTIONS_DIR / "README.md").read_text()
    for licence in ("Apache-2.0", "MIT", "CC BY-SA 3.0", "CC BY-NC"):
        assert licence in readme
    assert len(load_task("gsm8k", limit=3).questions) == 3


def test_alpaca_resolves_from_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTTREE_BENCH_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DraftTreeError, match="--data-dir"):
        load_task("alpaca")
    d = tmp_path / "data"
    d.mkdir()
    (d / "alpaca.jsonl").write_text('{"question_id": 0, "category": "", "turns": ["Say hi."]}\n')
    assert load_task("alpaca", data_dir=d).questions[0].turns == ["Say hi."]
    monkeypatch.setenv("DRAFTTREE_BENCH_DATA", str(d))
    assert load_task("alpaca").name == "alpaca"


def test_user_file_and_malformed_lines(tmp_path):
    good = tmp_path / "mine.jsonl"
    good.write_text('{"question_id": "a", "turns": ["x", "y"]}\n\n{"question_id": 2, "turns": ["z"]}\n')
    task = load_task(str(good))
    assert task.name == "mine" and [q.question_id for q in task.questions] == ["a", 2]
    cases = {
        '{"question_id": 1, "turns": ["ok"]}\n{not json\n': "not valid JSON",
        '{"question_id": 1, "turns": ["ok"]}\n{"question_id": 2, "turns": []}\n': "turns",
        '{"question_id": 1, "turns": ["ok"]}\n{"turns": ["x"]}\n': "question_id",
        '{"question_id": 1, "turns": ["ok"]}\n{"question_id": 1, "turns": ["x"]}\n': "duplicate",
        '{"question_id": 1, "turns": ["ok"]}\n[1, 2]\n': "JSON object",
        '{"question_id": 1, "turns": ["ok"]}\n{"question_id": 2, "turns": ["x"], "regex": "a", "choice": ["a"]}\n':
            "give one of",
    }
    for i, (text, what) in enumerate(cases.items()):
        bad = tmp_path / f"bad{i}.jsonl"
        bad.write_text(text)
        with pytest.raises(DraftTreeError, match=what) as e:
            read_questions(bad)
        assert f"{bad}:2" in str(e.value)


def test_unknown_task():
    with pytest.raises(DraftTreeError, match="unknown task 'nope'"):
        load_task("nope")
    with pytest.raises(DraftTreeError, match="not found"):
        load_task("missing/file.jsonl")
    with pytest.raises(DraftTreeError, match="twice"):
        load_tasks(["qa", "qa"])


# ---------------------------------------------------------------------------------------------- config


def test_presets_quick_and_overrides():
    s = R.resolve_config(setting="S")
    assert s.model == "smollm2-135m-instruct" and len(s.tasks) == 6 and "eagle2" in s.methods
    assert not s.strict_methods
    q = R.resolve_config(quick=True)
    assert (q.prompts, q.max_new_tokens, q.repeats, q.warmup) == (2, 32, 1, 1)
    assert q.methods == ["hf-ar", "ar", "lookup", "eagle2", "auto"]
    assert q.tasks == ["mt_bench", "humaneval", "sum", "qa"]
    lq = R.resolve_config(setting="L", quick=True, max_new_tokens=16, methods=["ar", "draft"])
    assert lq.draft_model and lq.tasks == ["humaneval"] and lq.max_new_tokens == 16 and lq.strict_methods
    assert R.resolve_config(head="none").head is None
    with pytest.raises(DraftTreeError, match="unknown method"):
        R.resolve_config(methods=["ar", "medusa"])
    with pytest.raises(DraftTreeError, match="setting"):
        R.resolve_config(setting="XL")
    a, b = R.prompt_seed(0, "qa", 1), R.prompt_seed(0, "qa", 2)
    assert a != b and a == R.prompt_seed(0, "qa", 1) and a != R.prompt_seed(1, "qa", 1)


def test_missing_draft_model_fails_or_skips():
    strict = R.BenchRunner(R.resolve_config(methods=["ar", "draft"]), show_progress=False, log=lambda m: None)
    with pytest.raises(DraftTreeError, match="draft model"):
        strict.load()  # fails before loading anything


# --------------------------------------------------------------------------------------------- metrics


def _rec(method, task, qid, tps, turns_tokens, accept=None, fwd=None, error=None):
    if error:
        return {"method": method, "task": task, "question_id": qid, "error": error}
    new = sum(len(t) for t in turns_tokens)
    return {
        "method": method, "task": task, "question_id": qid, "error": None, "tokens_per_second": tps,
        "new_tokens": new, "wall_time": new / tps, "target_forwards": fwd if fwd is not None else
        (len(accept) if accept else new), "accept_lengths": accept,
        "time_split": None if accept is None else {"prefill": 0.1, "draft": 0.2, "verify": 0.3, "other": 0.0,
                                                   "overhead": 0.0},
        "turns": [{"tokens": t} for t in turns_tokens],
    }


def test_ratio_of_means_tau_and_losslessness():
    recs = [
        _rec("hf-ar", "t", 1, 5.0, [[1, 2, 3]]), _rec("hf-ar", "t", 2, 20.0, [[4, 5], [6]]),
        _rec("ar", "t", 1, 4.0, [[1, 2, 3]], accept=[1, 1, 1]), _rec("ar", "t", 2, 16.0, [[4, 5], [6]],
                                                                    accept=[1, 1, 1]),
        _rec("lookup", "t", 1, 10.0, [[1, 2, 3]], accept=[1, 2]),
        _rec("lookup", "t", 2, 20.0, [[4, 5], [7, 8]], accept=[1, 1, 2]),
    ]
    s = M.summarize_results(recs, ["hf-ar", "ar", "lookup"], ["t"], temperature=0.0)
    assert s["baseline"] == "hf-ar" and s["lossless_reference"] == "ar"
    lk = s["results"]["lookup"]["t"]
    assert lk["tokens_per_second"] == 15.0
    assert lk["pooled_tokens_per_second"] == pytest.approx(7 / (3 / 10.0 + 4 / 20.0), abs=1e-3)  # 14, not 15
    assert lk["speedup"] == pytest.approx(15.0 / 12.5, abs=1e-4)  # ratio of means, not mean of ratios (1.5)
    assert lk["speedup_vs_ar"] == pytest.approx(15.0 / 10.0, abs=1e-4)
    assert lk["tau"] == pytest.approx(7 / 5, abs=1e-4)  # pooled over all forwards
    assert lk["accept_length_hist"] == {"1": 3, "2": 2}
    assert lk["identical_prompts"] == 1 and lk["compared_prompts"] == 2
    assert lk["divergences"] == [{"question_id": 2, "turn": 1, "position": 0}]
    assert s["results"]["hf-ar"]["t"]["tau"] is None and s["results"]["hf-ar"]["t"]["speedup"] == 1.0
    assert s["results"]["ar"]["t"]["identical_prompts"] == 2
    # sampled runs: the seed fixes every sample, so our methods are compared with `ar`; transformers' are not
    s1 = M.summarize_results(recs, ["hf-ar", "ar", "lookup"], ["t"], temperature=1.0)
    assert s1["lossless_reference"] == "ar" and s1["results"]["lookup"]["t"]["identical_prompts"] == 1
    assert s1["results"]["hf-ar"]["t"]["identical_prompts"] is None
    s2 = M.summarize_results([r for r in recs if r["method"] != "ar"], ["hf-ar", "lookup"], ["t"], temperature=1.0)
    assert s2["lossless_reference"] is None and s2["results"]["lookup"]["t"]["identical_prompts"] is None
    assert M.first_difference([1, 2], [1, 2, 3]) == 2 and M.first_difference([1], [1]) is None


def test_accepted_drafts_per_forward_by_source():
    """A merged tree's τ - 1 split by the source(s) behind each accepted draft, pooled over forwards."""
    from drafttree.bench.report import split_table

    a = _rec("auto", "t", 1, 10.0, [[1, 2, 3, 4, 5]], accept=[3, 2])  # 2 forwards, 3 accepted drafts
    a["source_accepts"] = {"ngram": 2, "head": 2}  # one draft was proposed by both
    b = _rec("auto", "t", 2, 10.0, [[6, 7]], accept=[1, 1])
    b["source_accepts"] = {"ngram": 0, "head": 0}
    c = _rec("ar", "t", 1, 5.0, [[1, 2, 3, 4, 5]], accept=[1] * 5)
    s = M.summarize_results([a, b, c], ["ar", "auto"], ["t"], temperature=0.0)
    auto = s["results"]["auto"]
    assert auto["t"]["source_tau"] == {"head": 0.5, "ngram": 0.5}  # 2 drafts each over 4 forwards
    assert auto["mean"]["source_tau"] == {"head": 0.5, "ngram": 0.5}
    assert s["results"]["ar"]["t"]["source_tau"] is None
    table = split_table({**s, "methods": ["ar", "auto"]})
    assert "by source" in table and "head 0.50, ngram 0.50" in table


def test_mean_over_tasks_failures_and_retries():
    recs = [
        _rec("ar", "a", 1, 10.0, [[1]], accept=[1]), _rec("ar", "b", 1, 10.0, [[1]], accept=[1]),
        _rec("lookup", "a", 1, 20.0, [[1]], accept=[1]), _rec("lookup", "b", 1, 0, [], error="boom"),
        _rec("lookup", "b", 2, 0, [], error="boom"), _rec("lookup", "b", 2, 30.0, [[1]], accept=[1]),  # retried
        _rec("ar", "b", 2, 10.0, [[1]], accept=[1]),
    ]
    s = M.summarize_results(recs, ["ar", "lookup"], ["a", "b"], temperature=0.0)
    lk = s["results"]["lookup"]
    assert s["baseline"] == "ar"
    assert lk["b"]["prompts"] == 1 and lk["b"]["failed"] == 1 and lk["b"]["failed_ids"] == ["1"]
    assert lk["a"]["speedup"] == 2.0 and lk["b"]["speedup"] == 3.0  # b compared on the common prompt only
    assert lk["mean"]["speedup"] == 2.5 and lk["mean"]["prompts"] == 2 and lk["mean"]["failed"] == 1
    assert lk["mean"]["identical_prompts"] == 2
    assert lk["mean"]["pooled_tokens_per_second"] == 25.0  # each task's pooled rate (20, 30), averaged
    assert M.median_index([3.0, 1.0, 2.0]) == 2 and M.median_index([1.0, 4.0]) == 0


# ---------------------------------------------------------------------------------------------- resume


class _FakeRunner(R.BenchRunner):
    calls: list = []
    failed_once = False

    def load(self):
        self.threads, self.dtype, self.device, self.head_path = 1, "float32", "cpu", None
        self.methods = [m for m in self.cfg.methods]

    def warm_up(self, method, task):
        pass

    def run_prompt(self, method, task, q):
        _FakeRunner.calls.append((method, task.name, q.question_id))
        if q.question_id == "boom" and not _FakeRunner.failed_once:
            _FakeRunner.failed_once = True
            return {"method": method, "task": task.name, "question_id": q.question_id, "error": "RuntimeError: x"}
        return _rec(method, task.name, q.question_id, 10.0, [[1, 2]], accept=[1, 1])


def test_resume_skips_recorded_prompts(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "BenchRunner", _FakeRunner)
    qf = tmp_path / "q.jsonl"
    qf.write_text("".join(json.dumps({"question_id": i, "turns": ["x"]}) + "\n" for i in (1, 2, "boom")))
    cfg = R.resolve_config(methods=["ar", "lookup"], tasks=[str(qf)], warmup=0)
    out = tmp_path / "run"
    _FakeRunner.calls, _FakeRunner.failed_once = [], False
    R.run_bench(cfg, out, command="drafttree bench first", show_progress=False, plots=False)
    assert len(_FakeRunner.calls) == 6
    lines = (out / "results.jsonl").read_text().splitlines()
    assert sum(bool(json.loads(x)["error"]) for x in lines) == 1  # the failure is recorded, the run went on
    # an interrupted run: a torn last line is ignored, the missing prompt and the failed one run again
    (out / "results.jsonl").write_text("\n".join(lines[:3]) + '\n{"method": "lookup", "ta')
    _FakeRunner.calls = []
    summary = R.run_bench(cfg, out, command="drafttree bench second", show_progress=False, plots=False)
    # methods run interleaved per prompt: ar 1, lookup 1, ar 2 | lookup 2, ar boom (failed), lookup boom
    assert _FakeRunner.calls == [("lookup", "q", 2), ("ar", "q", "boom"), ("lookup", "q", "boom")]
    assert summary["commands"] == ["drafttree bench first", "drafttree bench second"]
    assert summary["results"]["lookup"]["q"]["prompts"] == 3 and summary["results"]["ar"]["q"]["failed"] == 0
    _FakeRunner.calls = []
    R.run_bench(cfg, out, show_progress=False, plots=False)
    assert _FakeRunner.calls == []
    other = R.resolve_config(methods=["ar"], tasks=[str(qf)], temperature=1.0)
    with pytest.raises(DraftTreeError, match="other settings"):
        R.run_bench(other, out, show_progress=False, plots=False)
    R.run_bench(other, out, show_progress=False, plots=False, overwrite=True)


# ---------------------------------------------------------------------------------------------- report


def _synthetic_run(d: Path) -> None:
    d.mkdir(parents=True)
    run = {"schema": R.SCHEMA, "state": {"model": "m", "draft_model": None, "head": None, "dtype": "float32",
                                         "device": "cpu", "temperature": 0.0, "max_new_tokens": 8, "repeats": 1,
                                         "seed": 0, "threads": 2},
           "commands": ["drafttree bench --quick --out X"], "canonical_command": "drafttree bench ...",
           "methods": ["hf-ar", "ar", "lookup"], "tasks": ["mt_bench", "qa"], "notes": [],
           "skipped_methods": {"eagle2": "it needs an EAGLE head"}, "setting": None, "quick": True,
           "machine": {"cpu": "Test CPU", "threads": 2, "date": "2026-01-01T00:00:00+00:00", "torch": "t"}}
    (d / "run.json").write_text(json.dumps(run))
    recs = []
    for t in ("mt_bench", "qa"):
        recs += [_rec("hf-ar", t, 1, 10.0, [[1, 2]]), _rec("ar", t, 1, 8.0, [[1, 2]], accept=[1, 1]),
                 _rec("lookup", t, 1, 16.0, [[1, 2]], accept=[2])]
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_outputs_and_report(tmp_path):
    run = tmp_path / "run-a"
    _synthetic_run(run)
    s = write_outputs(run, plots=True)
    assert {"tokens_per_second", "speedup", "tau", "identical_prompts", "prompts"} <= set(s["results"]["lookup"]["qa"])
    assert s["results"]["lookup"]["mean"]["speedup"] == 1.6 and s["results"]["lookup"]["mean"]["tau"] == 2.0
    assert json.loads((run / "summary.json").read_text())["command"] == "drafttree bench --quick --out X"
    table = (run / "table.md").read_text()
    assert "| lookup | 1.60x (2.00) | 1.60x (2.00) | 1.60x (2.00) |" in table
    assert "| hf-ar | 1.00x (—)" in table and "MT-bench" in table and "Natural Ques." in table
    assert "Skipped `eagle2`" in table
    for png in ("speedup.png", "tau_hist.png"):
        assert (run / png).read_bytes()[:4] == b"\x89PNG"
    doc = tmp_path / "docs" / "benchmarks.md"
    text = render_report([run], doc)
    assert doc.read_text() == text
    assert "drafttree bench --quick --out X" in text and "Test CPU" in text and "2026-01-01" in text
    assert "](img/run-a-speedup.png)" in text and (tmp_path / "docs" / "img" / "run-a-speedup.png").exists()
    with pytest.raises(DraftTreeError):
        render_report([tmp_path / "nothing"], doc)


def test_cli_parses_run_and_report():
    from drafttree.cli import build_parser

    p = build_parser()
    a = p.parse_args(["bench", "--quick", "--out", "d", "--methods", "ar,lookup", "--methods", "hf-ar"])
    assert a.func.__name__ == "cmd_bench" and a.quick and a.out == "d"
    assert a.bench_argv == ["--quick", "--out", "d", "--methods", "ar,lookup", "--methods", "hf-ar"]
    r = p.parse_args(["bench", "report", "r1", "r2", "--out", "docs/x.md"])
    assert r.func.__name__ == "cmd_report" and r.runs == ["r1", "r2"] and r.report_out == "docs/x.md"


# ------------------------------------------------------------------------------------------ end to end


def test_end_to_end_quick_run_float32(tmp_path):
    from drafttree.cli import main

    out = tmp_path / "run"
    rc = main(["bench", "--quick", "--methods", "ar,lookup,hf-ar,lookup:linears=torch", "--tasks", "qa",
               "--prompts", "1",
               "--max-new-tokens", "8", "--dtype", "float32", "--threads", "2", "--out", str(out)])
    assert rc == 0
    for name in ("results.jsonl", "run.json", "summary.json", "table.md", "speedup.png", "tau_hist.png"):
        assert (out / name).exists(), name
    s = json.loads((out / "summary.json").read_text())
    assert s["command"].startswith("drafttree bench --quick --methods ar,lookup,hf-ar,lookup:linears=torch")
    assert s["machine"]["threads"] == 2 and s["config"]["dtype"] == "float32"
    lk = s["results"]["lookup"]["qa"]
    assert lk["prompts"] == 1 and lk["identical_prompts"] == lk["prompts"]
    assert s["results"]["hf-ar"]["qa"]["tau"] is None and s["results"]["ar"]["qa"]["tau"] == 1.0
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 4 and all(not r["error"] and 0 < r["new_tokens"] <= 8 for r in recs)
    # the benchmark's own option: the same method on torch's linear kernels, with a drafter of its own
    assert s["results"]["lookup:linears=torch"]["qa"]["identical_prompts"] == 1


def test_prefix_cache_variant_reuses_only_a_conversations_own_turns(tmp_path):
    """``METHOD:prefix_cache=true``: a question's later turns reuse its earlier turns' keys; its first turn is
    computed whole in every repeat (as every method's), and the answers are plain decoding's."""
    from drafttree.cli import main

    out = tmp_path / "run"
    rc = main(["bench", "--quick", "--methods", "ar,ar:prefix_cache=true,lookup:prefix_cache=true", "--tasks",
               "mt_bench", "--prompts", "1", "--repeats", "2", "--max-new-tokens", "8", "--dtype", "float32",
               "--threads", "2", "--out", str(out)])
    assert rc == 0
    recs = {r["method"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    plain = recs["ar"]
    assert [t["cached_tokens"] for t in plain["turns"]] == [0, 0]
    for m in ("ar:prefix_cache=true", "lookup:prefix_cache=true"):
        first, second = recs[m]["turns"]
        assert first["cached_tokens"] == 0 and recs[m]["identical_across_repeats"]
        assert second["cached_tokens"] > first["prompt_tokens"], "the second turn reuses the first and its answer"
        assert [t["tokens"] for t in recs[m]["turns"]] == [t["tokens"] for t in plain["turns"]]


def test_head_variants_run_side_by_side(tmp_path, capsys):
    """``METHOD:head=DIR`` runs a method with another head in the same run (an old and a new head compared);
    here with no --head at all, so the variant's head is the only one loaded."""
    from drafttree.cli import main
    from drafttree.heads import shipped_head_dir

    shipped = shipped_head_dir("smollm2-135m-instruct")
    out = tmp_path / "run"
    rc = main(["bench", "--quick", "--head", "none", "--methods", f"ar,eagle2:head={shipped}", "--tasks", "qa",
               "--prompts", "1", "--max-new-tokens", "12", "--dtype", "float32", "--threads", "2", "--out", str(out)])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    res = s["results"][f"eagle2:head={shipped}"]["qa"]
    assert res["identical_prompts"] == 1 and res["tau"] > 1.0, "the variant drafted with its head, losslessly"
    capsys.readouterr()
    rc = main(["bench", "--quick", "--head", "none", "--methods", f"ar,eagle2:head={tmp_path / 'nothing'}",
               "--tasks", "qa", "--prompts", "1", "--max-new-tokens", "4", "--dtype", "float32",
               "--out", str(tmp_path / "bad")])
    assert rc == 2 and "nothing" in capsys.readouterr().err
    rc = main(["bench", "--quick", "--methods", f"ar,lookup:head={shipped}", "--tasks", "qa", "--prompts", "1",
               "--max-new-tokens", "4", "--dtype", "float32", "--out", str(tmp_path / "bad2")])
    assert rc == 2 and "head= applies to methods that draft with a head" in capsys.readouterr().err


def test_linear_kernel_variants_are_a_benchmark_option():
    import contextlib

    from drafttree.kernels import torch_linears

    assert R.method_parts("eagle2:k=4:linears=torch") == ("eagle2", {"k": 4}, torch_linears, None, False)
    assert R.method_parts("eagle2:k=4") == ("eagle2", {"k": 4}, contextlib.nullcontext, None, False)
    assert R.method_parts("auto:head=runs/x/head").head == "runs/x/head"
    assert R.method_parts("auto:prefix_cache=true") == ("auto", {}, contextlib.nullcontext, None, True)
    with pytest.raises(DraftTreeError, match="linears="):
        R.method_parts("ar:linears=fast")
    with pytest.raises(DraftTreeError, match="prefix_cache="):
        R.method_parts("ar:prefix_cache=3")


def test_concurrency_conversations_with_the_prefix_cache(tmp_path, capsys):
    """``bench concurrency --turns N``: each user a conversation, its next turn sent when the last answer ends; with
    ``METHOD:prefix_cache=true`` the later turns come from the pool (its share of the prompts printed)."""
    from pathlib import Path

    from drafttree.cli import main

    chats = str(Path(__file__).resolve().parents[1] / "data" / "heldout" / "chat_turns.jsonl")
    out = tmp_path / "turns"
    rc = main(["bench", "concurrency", "--users", "1,2", "--turns", "3", "--tasks", chats, "--methods",
               "ar,ar:prefix_cache=true", "--max-new-tokens", "6", "--dtype", "float32", "--threads", "2",
               "--out", str(out)])
    assert rc == 0
    rows = {(r["users"], r["method"]): r for r in json.loads((out / "concurrency.json").read_text())["rows"]}
    for u in (1, 2):
        plain, cached = rows[(u, "ar")], rows[(u, "ar:prefix_cache=true")]
        assert plain["requests"] == 3 * u and plain["tokens"] == cached["tokens"] <= 6 * 3 * u
        assert plain["cached_share"] == 0 and cached["cached_share"] > 0.3 and cached["ttft"] > 0
    assert "a conversation per user (3 turns" in (out / "concurrency.md").read_text()
    assert main(["bench", "concurrency", "--users", "20", "--turns", "3", "--tasks", chats, "--methods", "ar",
                 "--dtype", "float32", "--out", str(tmp_path / "x")]) != 0
    assert "20 users need 20" in capsys.readouterr().err


def test_concurrency_steady_load_with_repeats(tmp_path, capsys, monkeypatch):
    """``bench concurrency``: U users x R requests served U at a time, methods interleaved, the median run
    reported with every run's figure; hf-ar (one padded batch) refuses a steady load."""
    from drafttree.cli import main

    out = tmp_path / "conc"
    rc = main(["bench", "concurrency", "--users", "1,2", "--methods", "auto,ar", "--max-new-tokens", "4",
               "--requests-per-user", "2", "--repeats", "2", "--dtype", "float32", "--threads", "2",
               "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "concurrency.json").read_text())
    rows = {(r["users"], r["method"]): r for r in data["rows"]}
    assert set(rows) == {(1, "auto"), (1, "ar"), (2, "auto"), (2, "ar")}
    for (u, _), r in rows.items():
        assert r["requests"] == 2 * u and len(r["all_aggregate_tps"]) == 2
        assert 0 < r["tokens"] <= 4 * 2 * u and r["per_user_tps"] == pytest.approx(r["aggregate_tps"] / u)
        assert min(r["all_aggregate_tps"]) <= round(r["aggregate_tps"], 2) <= max(r["all_aggregate_tps"])
        assert 0 < r["longest_wait_s"] < r["wall"]  # the longest a user waited between two of its chunks
    assert data["meta"]["prefill_chunk"] == 512
    assert "steady load (2 requests per user in turn), median of 2 interleaved runs" in \
        (out / "concurrency.md").read_text()
    assert "alone_tps" not in rows[(2, "auto")]
    for u in (1, 2):  # each repeat's auto run over the ar run of the same repeat
        a, b = rows[(u, "auto")]["all_aggregate_tps"], rows[(u, "ar")]["all_aggregate_tps"]
        paired = rows[(u, "auto")]["paired_vs_ar"]
        assert len(paired) == len(a)
        for p, x, y in zip(paired, a, b):  # the runs' rates are rounded to 0.01: a slow machine's ratios move by more
            assert p == pytest.approx(x / y, rel=1e-3 + 0.005 / x + 0.005 / y)
        assert "paired_vs_ar" not in rows[(u, "ar")]
    assert "(runs paired: median" in (out / "concurrency.md").read_text()
    assert "; longest wait " in (out / "concurrency.md").read_text()
    out = tmp_path / "alone"
    from drafttree.bench import concurrency

    calls = []
    real = concurrency.run_ours

    def counted(sm, prompts, spec, max_new_tokens, max_batch=None, cached=None):
        calls.append((spec, len(prompts), max_new_tokens, max_batch))
        return real(sm, prompts, spec, max_new_tokens, max_batch=max_batch, cached=cached)

    monkeypatch.setattr(concurrency, "run_ours", counted)
    assert main(["bench", "concurrency", "--users", "1,3", "--methods", "auto,ar", "--max-new-tokens", "5",
                 "--alone", "--dtype", "float32", "--out", str(out)]) == 0
    # warm-up: both methods at 2 rows, then an untimed short burst of both at 3 users before 3 users' timed runs
    three = [c for c in calls if c[1] == 3]
    assert three[:2] == [("auto", 3, 4, 3), ("ar", 3, 4, 3)] and all(c[2] == 5 for c in three[2:])
    rows = {(r["users"], r["method"]): r for r in json.loads((out / "concurrency.json").read_text())["rows"]}
    assert rows[(1, "auto")]["alone_tps"] == rows[(1, "auto")]["aggregate_tps"]  # one request: the run itself
    assert rows[(3, "auto")]["alone_tps"] > 0 and "alone_tps" not in rows[(3, "ar")]
    assert "auto vs the same requests one at a time" in (out / "concurrency.md").read_text()
    assert main(["bench", "concurrency", "--users", "1", "--methods", "hf-ar", "--requests-per-user", "2",
                 "--dtype", "float32", "--out", str(tmp_path / "x")]) != 0
    assert "hf-ar serves one padded batch" in capsys.readouterr().err
