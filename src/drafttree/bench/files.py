"""A benchmark run directory: its file names and the readers and writers of its records, in one place."""

from __future__ import annotations

import json
from pathlib import Path

from drafttree.errors import DraftTreeError

RESULTS = "results.jsonl"  # one record per (method, task, question_id), appended as prompts finish
RUN_FILE = "run.json"  # the settings a resumed run must match, commands, notes
SUMMARY = "summary.json"  # aggregated figures (bench/metrics.py), rebuilt from the records
SCHEMA = "drafttree-bench/1"


def read_records(path: str | Path) -> list[dict]:
    """The records of a results.jsonl; a torn last line (killed mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if no == len(lines):
                continue
            raise DraftTreeError(f"{path}:{no}: corrupt record (not JSON)") from None
    return out


def repair_tail(path: Path) -> None:
    """Drop a torn last line (a run killed mid-write) so that appended records start on a line of their own."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])
