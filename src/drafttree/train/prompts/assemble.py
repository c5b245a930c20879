"""Collecting every source's candidates, and the whole assembly (``drafttree data prompts``)."""

from __future__ import annotations

import os
import warnings
import zipfile
from pathlib import Path

from tqdm.auto import tqdm

import drafttree.train.prompts.builders as B
from drafttree.train.prompts.core import EVALS_SETS, PACKAGES, Candidate, load_data
from drafttree.train.prompts.generated import (
    build_chat_prompts,
    build_code_requests,
    build_knowledge_questions,
    build_word_problems,
)
from drafttree.train.prompts.mixing import (
    BenchIndex,
    default_bench_dirs,
    read_bench_questions,
    select_prompts,
    write_jsonl,
)
from drafttree.train.prompts.pycode import build_code_line_prompts, build_code_prompts, stdlib_functions
from drafttree.train.prompts.sources import (
    default_sources_dir,
    fetch_bigbench,
    fetch_package,
    read_bigbench,
    read_jsonl,
)


def _collect_inspect_evals(path: Path, seed: int) -> list[Candidate]:
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        wb = read_jsonl(zf.read("inspect_evals/writingbench/benchmark_all.jsonl"))
        persist = []
        for stem in ("beneficial_samples", "cross_domain", "sycophancy"):
            name = f"inspect_evals/persistbench/benchmark_samples/{stem}.jsonl"
            if name in names:
                persist.extend((stem, row) for row in read_jsonl(zf.read(name)))
        fresh = [zf.read(n).decode("utf-8") for n in sorted(names)
                 if n.startswith("inspect_evals/abstention_bench/data/freshqa/") and n.endswith(".csv")]
    return B.build_writingbench(wb) + B.build_persistbench(persist) + B.build_freshqa(fresh)


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
                out += B.build_evals_set(name, category, mode, read_jsonl(zf.read(prefix + rel)), seed)
        owt = read_jsonl(zf.read(prefix + "schelling_point/owt_5.jsonl"))
        wiki = read_jsonl(zf.read(prefix + "schelling_point/wikipedia_5.jsonl"))
        for rel in ("twenty_questions/lexicon_nouns.jsonl", "twenty_questions/dataset.jsonl"):
            if prefix + rel in names:
                nouns += [str(r["word"]) for r in read_jsonl(zf.read(prefix + rel)) if r.get("word")]
        if prefix + "text_compression/samples.jsonl" in names:
            rows = read_jsonl(zf.read(prefix + "text_compression/samples.jsonl"))
            quotes = [r["text"] for r in rows if r.get("type") == "Abirate/english_quotes"]
            web = [(f"{r['type']}:{i}", r["text"]) for i, r in enumerate(rows)
                   if r.get("type") in ("c4", "wikipedia") and isinstance(r.get("text"), str)]
        abstracts: list[tuple[str, str]] = []
        if prefix + "abstract2title/samples.jsonl" in names:
            for i, rec in enumerate(read_jsonl(zf.read(prefix + "abstract2title/samples.jsonl"))):
                users = [m["content"] for m in B.messages(rec) if m.get("role") == "user"]
                if users:
                    abstracts.append((str(i), users[-1]))
    # each abstract is used once: even ones for titles (writing), odd ones for summaries
    out = [c for c in out if c.source != "evals/abstract2title" or int(c.key) % 2 == 0]
    out += B.build_abstract_summaries([a for a in abstracts if int(a[0]) % 2 == 1], seed)
    out += B.build_summaries("evals/owt", [(str(i), r.get("0", "")) for i, r in enumerate(owt)], seed)
    out += B.build_summaries("evals/web_text", web, seed)
    wiki_pairs = [(str(i), r.get("0", "")) for i, r in enumerate(wiki)]
    # two Wikipedia passages in three are summarized, the third is used for extraction / rewriting
    out += B.build_summaries("evals/wikipedia", [w for i, w in enumerate(wiki_pairs) if i % 3 != 2], seed)
    out += B.build_rewrites(wiki_pairs[2::3], seed)
    out += B.build_writing_templates(nouns, quotes, seed)
    out += B.build_concept_sets(nouns, seed)
    return out


def _collect_templates(seed: int) -> list[Candidate]:
    return (build_word_problems(seed) + build_chat_prompts(seed) + build_knowledge_questions(seed)
            + build_code_requests(seed))


def _collect_stdlib(seed: int, show_progress: bool) -> list[Candidate]:
    functions = stdlib_functions(show_progress)
    return build_code_prompts(functions, seed) + build_code_line_prompts(functions, seed)


def collect_bigbench(tasks: dict[str, object], seed: int) -> list[Candidate]:
    """Candidates from the parsed BIG-bench task files, in the order of ``BIGBENCH_SOURCES`` (sources.json)."""
    out: list[Candidate] = []
    for src in load_data("sources")["BIGBENCH_SOURCES"]:
        obj = tasks.get(src["task"])
        examples = list(obj.get("examples", [])) if isinstance(obj, dict) else []
        build = src["build"]
        if build == "topical_chat":
            out += B.build_topical_chat(examples, seed=seed)
        elif build == "mathqa":
            out += B.build_mathqa(examples, seed)
        elif build == "common_gen":
            out += B.build_common_gen(examples, seed)
        elif build == "summaries":
            out += B.build_summaries(f"bigbench/{src['name']}",
                                     [(str(i), e.get("input", "")) for i, e in enumerate(examples)], seed)
        elif build == "questions":
            out += B.build_bigbench_questions(src["name"], src["category"], examples, field=src.get("field", "input"),
                                              template=src.get("template", "{q}"))
        else:
            raise ValueError(f"sources.json: unknown BIG-bench builder {build!r}")
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
        steps.insert(2, ("bigbench", lambda: collect_bigbench(
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
    ``bench_dir`` holds the evaluation question files (default: ``../shared/data/bench`` next to the repo
    and the package's own question files); prompts overlapping them are dropped. When none is found the
    check is skipped with a warning. ``include_bigbench`` (default False) adds the BIG-bench sources,
    ignoring their no-training canary.
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
