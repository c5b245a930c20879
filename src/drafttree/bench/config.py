"""Benchmark settings: presets, the run configuration and its validation, method specs and prompt seeds."""

from __future__ import annotations

import shlex
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from drafttree.bench.peers import HF_METHODS
from drafttree.bench.tasks import BUILTIN
from drafttree.errors import DraftTreeError

BENCH_METHODS = ["eagle-chain-oracle"]  # measurement only (bench/oracle.py): not decoding methods

# settings that change the numbers: a resumed run must use the same ones
FINGERPRINT_KEYS = ("model", "draft_model", "head", "dtype", "device", "temperature", "max_new_tokens", "repeats",
                    "seed", "threads")

SETTINGS: dict[str, dict] = {
    "S": {"model": "smollm2-135m-instruct", "draft_model": None, "tasks": list(BUILTIN),
          "methods": ["hf-ar", "ar", "lookup", "hf-lookup", "eagle-chain", "eagle1", "eagle2", "switch", "auto"]},
    "L": {"model": "qwen2.5-coder-1.5b-instruct", "draft_model": "qwen2.5-coder-0.5b-instruct",
          "tasks": ["humaneval"],
          "methods": ["hf-ar", "ar", "hf-assisted", "draft", "lookup", "switch", "auto"]},
}
QUICK = {"prompts": 2, "max_new_tokens": 32, "repeats": 1, "warmup": 1,
         "methods": ["hf-ar", "ar", "lookup", "eagle2", "auto"], "tasks": ["mt_bench", "humaneval", "sum", "qa"]}
DEFAULTS = {"model": "smollm2-135m-instruct", "draft_model": None, "head": "auto", "tasks": list(BUILTIN),
            "methods": SETTINGS["S"]["methods"], "temperature": 0.0, "max_new_tokens": 256, "prompts": None,
            "repeats": 1, "warmup": 2, "dtype": "auto", "device": "auto", "threads": None, "seed": 0}


def positive_ints(text: str, flag: str, what: str = "counts") -> list[int]:
    """Comma-separated counts (token counts, numbers of users): sorted, distinct, each >= 1, or a one-line error."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise DraftTreeError(f"{flag} takes comma-separated {what}, got {text!r}") from None
    if not values or min(values) < 1:
        raise DraftTreeError(f"{flag} takes {what} >= 1, got {text!r}")
    return sorted(set(values))


@dataclass
class BenchConfig:
    model: str = DEFAULTS["model"]
    draft_model: str | None = None
    head: str | None = "auto"  # "auto" (the shipped head, if any), a directory, or None (no head)
    methods: list[str] = field(default_factory=lambda: list(DEFAULTS["methods"]))
    tasks: list[str] = field(default_factory=lambda: list(DEFAULTS["tasks"]))
    temperature: float = 0.0
    max_new_tokens: int = 256
    prompts: int | None = None  # per task; None = all
    repeats: int = 1
    warmup: int = 2
    dtype: str = "auto"
    device: str = "auto"
    threads: int | None = None
    seed: int = 0
    data_dir: str | None = None
    setting: str | None = None
    quick: bool = False
    # methods the user named explicitly must run (error when impossible); preset methods are skipped instead
    strict_methods: bool = False
    strict_tasks: bool = False  # likewise for tasks whose data file is missing (alpaca)

    def validate(self) -> None:
        from drafttree.drafters import METHODS

        known = ["auto"] + METHODS + BENCH_METHODS + HF_METHODS
        bad = [m for m in self.methods if parse_method(m)[0] not in known]
        if bad:
            raise DraftTreeError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(known)}")
        if len(set(self.methods)) != len(self.methods):
            raise DraftTreeError("a method is listed twice")
        if not self.methods or not self.tasks:
            raise DraftTreeError("nothing to run: no methods or no tasks")
        if self.temperature < 0:
            raise DraftTreeError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens <= 0:
            raise DraftTreeError(f"max new tokens must be > 0, got {self.max_new_tokens}")
        if self.repeats <= 0:
            raise DraftTreeError(f"repeats must be > 0, got {self.repeats}")
        if self.warmup < 0:
            raise DraftTreeError(f"warm-up runs must be >= 0, got {self.warmup}")
        if self.prompts is not None and self.prompts <= 0:
            raise DraftTreeError(f"prompts per task must be > 0, got {self.prompts}")
        if self.threads is not None and self.threads <= 0:
            raise DraftTreeError(f"threads must be > 0, got {self.threads}")


def resolve_config(setting: str | None = None, quick: bool = False, **overrides) -> BenchConfig:
    """Defaults < preset (``--setting``) < ``--quick`` sizes < explicit values (``None`` = not given)."""
    vals = dict(DEFAULTS)
    if setting is not None:
        if setting not in SETTINGS:
            raise DraftTreeError(f"unknown setting {setting!r}; choose one of {', '.join(SETTINGS)}")
        vals.update(SETTINGS[setting])
    if quick:
        vals.update({k: v for k, v in QUICK.items() if k not in ("methods", "tasks")})
        if setting is None:
            vals["methods"], vals["tasks"] = list(QUICK["methods"]), list(QUICK["tasks"])
    strict = overrides.get("methods") is not None
    strict_tasks = overrides.get("tasks") is not None
    for k, v in overrides.items():
        if v is not None:
            vals[k] = v
    if isinstance(vals.get("head"), str) and vals["head"].lower() == "none":
        vals["head"] = None
    cfg = BenchConfig(**{k: v for k, v in vals.items() if k in BenchConfig.__dataclass_fields__},
                      setting=setting, quick=quick, strict_methods=strict,
                      strict_tasks=strict_tasks)
    cfg.methods, cfg.tasks = list(cfg.methods), list(cfg.tasks)
    cfg.validate()
    return cfg


def canonical_command(cfg: BenchConfig, out: str | Path) -> str:
    """A command line with every setting explicit that reproduces ``cfg``."""
    parts = ["drafttree", "bench", "--model", cfg.model]
    if cfg.draft_model:
        parts += ["--draft-model", cfg.draft_model]
    parts += ["--head", cfg.head or "none", "--methods", ",".join(cfg.methods), "--tasks", ",".join(cfg.tasks),
              "--temperature", str(cfg.temperature), "--max-new-tokens", str(cfg.max_new_tokens)]
    if cfg.prompts:
        parts += ["--prompts", str(cfg.prompts)]
    parts += ["--repeats", str(cfg.repeats), "--warmup", str(cfg.warmup), "--dtype", cfg.dtype,
              "--device", cfg.device, "--seed", str(cfg.seed)]
    if cfg.threads:
        parts += ["--threads", str(cfg.threads)]
    if cfg.data_dir:
        parts += ["--data-dir", cfg.data_dir]
    parts += ["--out", str(out)]
    return shlex.join(parts)


def parse_method(spec: str) -> tuple[str, dict]:
    """``name`` or ``name:key=value:key=value`` (e.g. ``eagle-chain:depth=3``): a method plus its options.

    The whole spec is the method's label in the results, so one run can compare settings of one method.
    """
    name, _, rest = spec.partition(":")
    opts: dict = {}
    for part in filter(None, rest.split(":")):
        key, eq, val = part.partition("=")
        if not eq or not key:
            raise DraftTreeError(f"bad method option {part!r} in {spec!r}: expected key=value")
        for conv in (int, float):
            try:
                val = conv(val)
                break
            except ValueError:
                continue
        if val in ("true", "false"):
            val = val == "true"
        opts[key.replace("-", "_")] = val
    return name, opts


def prompt_seed(base: int, task: str, question_id) -> int:
    """The sampling seed of one prompt: stable across runs and methods, distinct across prompts."""
    return (int(base) * 1_000_003 + zlib.crc32(f"{task}/{question_id}".encode())) % (2**31 - 1)
