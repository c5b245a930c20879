"""Benchmark tasks: question files in the EAGLE / Spec-Bench JSONL format.

One JSON object a line: ``{"question_id": int|str, "category": str, "turns": [str, ...], "reference"?: ...}``, and
at most one structured-output constraint every answer follows: ``"json_schema"``, ``"regex"``, ``"choice"`` or
``"grammar"`` (as the library takes them).
Built-in names are the six sets of the EAGLE-2 paper; five ship inside the package (``questions/``), Alpaca
(CC BY-NC 4.0) does not and is read from a data directory. Any other name is taken as a file path.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from drafttree.errors import DraftTreeError

QUESTIONS_DIR = Path(__file__).resolve().parent / "questions"
VENDORED = ("mt_bench", "humaneval", "gsm8k", "sum", "qa", "json")
EXTERNAL = ("alpaca",)  # licence forbids shipping; resolved from the data directory
BUILTIN = ("mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa")  # the EAGLE-2 paper's order
DISPLAY = {"mt_bench": "MT-bench", "humaneval": "HumanEval", "gsm8k": "GSM8K", "alpaca": "Alpaca",
           "sum": "CNN/DM", "qa": "Natural Ques.", "json": "JSON (schema)"}
DATA_ENV = "DRAFTTREE_BENCH_DATA"


@dataclass
class Question:
    question_id: int | str
    category: str
    turns: list[str]
    reference: object = None
    constraint: dict | None = None  # structured output every answer follows, e.g. {"json_schema": {...}} (grammar.py)


@dataclass
class Task:
    name: str
    path: Path
    questions: list[Question] = field(default_factory=list)

    @property
    def display(self) -> str:
        return DISPLAY.get(self.name, self.name)


def default_data_dir() -> Path:
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    return Path.cwd() / ".." / "shared" / "data" / "bench"


def task_path(name: str, data_dir: str | Path | None = None) -> tuple[str, Path]:
    """(task name, file) for a built-in name or a path to a question file."""
    if name in VENDORED:
        return name, QUESTIONS_DIR / f"{name}.jsonl"
    if name in EXTERNAL:
        d = Path(data_dir).expanduser() if data_dir else default_data_dir()
        p = d / f"{name}.jsonl"
        if not p.is_file():
            raise DraftTreeError(
                f"task {name!r} is not shipped with drafttree (its licence, CC BY-NC 4.0, forbids it) and "
                f"{p} does not exist: pass --data-dir DIR holding {name}.jsonl (or set ${DATA_ENV})"
            )
        return name, p
    p = Path(name).expanduser()
    if p.is_file():
        return p.stem, p
    if p.suffix in (".jsonl", ".json") or os.sep in name:
        raise DraftTreeError(f"question file not found: {p}")
    raise DraftTreeError(f"unknown task {name!r}: choose one of {', '.join(BUILTIN)} or give a question file path")


def read_questions(path: str | Path) -> list[Question]:
    """Parse and validate a question file; errors name the file and the line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DraftTreeError(f"cannot read question file {path}: {e}") from None
    out: list[Question] = []
    seen: dict[object, int] = {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{no}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DraftTreeError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise DraftTreeError(f"{where}: expected a JSON object with question_id and turns")
        qid = obj.get("question_id")
        if qid is None or isinstance(qid, bool) or not isinstance(qid, (int, str)):
            raise DraftTreeError(f"{where}: missing or invalid 'question_id' (an integer or string)")
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise DraftTreeError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
        cat = obj.get("category", "")
        if cat is None:
            cat = ""
        if not isinstance(cat, str):
            raise DraftTreeError(f"{where}: 'category' must be a string")
        if qid in seen:
            raise DraftTreeError(f"{where}: duplicate question_id {qid!r} (first on line {seen[qid]})")
        seen[qid] = no
        kinds = [k for k in ("json_schema", "regex", "choice", "grammar") if obj.get(k) is not None]
        if len(kinds) > 1:
            raise DraftTreeError(f"{where}: give one of json_schema, regex, choice, grammar, not {' and '.join(kinds)}")
        out.append(Question(qid, cat, list(turns), obj.get("reference"),
                            {kinds[0]: obj[kinds[0]]} if kinds else None))
    if not out:
        raise DraftTreeError(f"question file {path} holds no questions")
    return out


def load_task(name: str, data_dir: str | Path | None = None, limit: int | None = None) -> Task:
    """A built-in task name (see ``BUILTIN``) or a question file path; ``limit`` keeps the first N questions."""
    tname, path = task_path(name, data_dir)
    qs = read_questions(path)
    if limit is not None:
        if limit <= 0:
            raise DraftTreeError(f"prompts per task must be > 0, got {limit}")
        qs = qs[:limit]
    return Task(tname, path, qs)


def load_tasks(names: list[str], data_dir: str | Path | None = None, limit: int | None = None) -> list[Task]:
    tasks = [load_task(n, data_dir, limit) for n in names]
    dup = {t.name for t in tasks if sum(u.name == t.name for u in tasks) > 1}
    if dup:
        raise DraftTreeError(f"task name given twice: {', '.join(sorted(dup))}")
    return tasks
