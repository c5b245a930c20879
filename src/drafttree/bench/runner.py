"""The benchmark runner: methods x tasks x prompts, answered turn by turn, recorded to ``results.jsonl``.

One line per (method, task, question_id), appended and flushed as soon as the prompt is done, so an
interrupted run continues where it stopped when the same command is run again (``run.json`` holds the
settings that must match). A prompt that fails is recorded with its error (and retried on resume).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

from drafttree.bench.config import (
    BENCH_METHODS,
    FINGERPRINT_KEYS,
    QUICK,
    SETTINGS,
    BenchConfig,
    canonical_command,
    parse_method,
    prompt_seed,
    resolve_config,
)
from drafttree.bench.files import RESULTS, RUN_FILE, SCHEMA, SUMMARY, read_records, repair_tail
from drafttree.bench.peers import HF_METHODS, hf_generate, needs_draft
from drafttree.bench.tasks import Question, Task, load_tasks
from drafttree.errors import DraftTreeError
from drafttree.kernels import torch_linears


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int, dtype: str, device: str) -> dict:
    import torch
    import transformers

    import drafttree

    info = {
        "cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": threads, "dtype": dtype, "device": device,
        "gpu": None, "torch": torch.__version__, "transformers": transformers.__version__,
        "drafttree": getattr(drafttree, "__version__", None), "python": platform.python_version(),
        "platform": platform.platform(), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return info


def done_keys(records: list[dict]) -> set[tuple]:
    """(method, task, question_id) recorded without error: a resumed run skips these."""
    state: dict[tuple, bool] = {}
    for r in records:
        state[(r["method"], r["task"], r["question_id"])] = not r.get("error")
    return {k for k, ok in state.items() if ok}


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BenchRunner:
    """Loads the models once, then answers every (method, task, question) it is asked to."""

    def __init__(self, cfg: BenchConfig, show_progress: bool = True, log=None):
        self.cfg = cfg
        self.show_progress = show_progress
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.notes: list[str] = []
        self.skipped: dict[str, str] = {}
        self.lm = None
        self.methods: list[str] = []
        self._variants: dict = {}  # method spec -> its own drafter (benchmark variants such as linears=torch)
        self._heads: dict = {}  # head=DIR variants' heads, by directory

    # ---- setup -------------------------------------------------------------------------------------------
    def _skip_or_fail(self, method: str, reason: str) -> None:
        if self.cfg.strict_methods:
            raise DraftTreeError(f"method {method!r} cannot run: {reason}")
        self.skipped[method] = reason
        self.note(f"skipping {method}: {reason}")

    def note(self, msg: str) -> None:
        self.notes.append(msg)
        self.log(f"[bench] {msg}")

    def load(self) -> None:
        import torch

        from drafttree.api import SpeculativeModel
        from drafttree.drafters import COMPOSED_METHODS, needs_head
        from drafttree.models import load_model

        def uses_models(m: str) -> bool:  # methods that take whatever head / draft LM is loaded
            return parse_method(m)[0] in ("auto", *COMPOSED_METHODS)

        cfg = self.cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)  # fixed for the whole run
        wanted = list(cfg.methods)
        for m in wanted:
            if needs_draft(parse_method(m)[0]) and not cfg.draft_model:
                self._skip_or_fail(m, "it needs a draft model (--draft-model)")
        wanted = [m for m in wanted if m not in self.skipped]
        target = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device, show_progress=self.show_progress)
        draft = None
        if cfg.draft_model and any(needs_draft(parse_method(m)[0]) or uses_models(m) for m in wanted):
            draft = load_model(cfg.draft_model, dtype=target.dtype, device=target.device,
                               show_progress=self.show_progress)
        head = None
        self.head_path = None
        head_methods = [m for m in wanted if (needs_head(parse_method(m)[0]) or parse_method(m)[0] in BENCH_METHODS)
                        and "head" not in parse_method(m)[1]]  # a head=DIR variant brings its own
        variants = [m for m in wanted if "head" in parse_method(m)[1]]
        for m in variants:
            if not (needs_head(parse_method(m)[0]) or uses_models(m)):
                self._skip_or_fail(m, "head= applies to methods that draft with a head")
        explicit = cfg.head not in (None, "", "auto") and variants  # compared with a head= variant: load it
        if (head_methods or explicit or any(uses_models(m) for m in wanted)) and cfg.head:
            from drafttree.heads import load_head_for, shipped_head_dir

            try:
                head = load_head_for(target, None if cfg.head == "auto" else cfg.head, required=False)
            except DraftTreeError as e:
                if cfg.head != "auto":
                    raise
                self.note(f"the shipped head does not load: {e}")
            if head is not None:
                self.head_path = str(getattr(head, "path", None) or shipped_head_dir(target.name) or cfg.head)
        if head is None:
            why = ("no head (--head none)" if not cfg.head else
                   f"no EAGLE head ships for {target.name!r} (train one and pass --head DIR)" if cfg.head == "auto"
                   else "no head")
            for m in head_methods:
                self._skip_or_fail(m, f"it needs an EAGLE head: {why}")
        self.lm = SpeculativeModel(target, method="ar", draft=draft, head=head)
        # the prefix_cache=true variants' model: the same weights, a cache kept between a conversation's turns
        self.cached_lm = SpeculativeModel(target, method="ar", draft=draft, head=head, prefix_cache=True) \
            if any(m not in HF_METHODS and parse_method(m)[1].get("prefix_cache") is True for m in wanted) else None
        self.methods = []
        for m in wanted:
            if m in self.skipped:
                continue
            if m not in HF_METHODS:
                try:  # build it now: config errors surface before any timing
                    name, opts, linears, head_dir, cached = method_parts(m)
                    if name in BENCH_METHODS:
                        self._drafter(m, torch.tensor([0, 1]), 1)
                    elif head_dir is None:  # a head=DIR variant is built below, with its head
                        (self.cached_lm if cached else self.lm).drafter(name, opts)
                    with linears():  # a variant's own drafter (and its verify-cost curve) before any timing
                        self._variant_drafter(m)
                except DraftTreeError as e:
                    self._skip_or_fail(m, str(e))
                    continue
            self.methods.append(m)
        if not self.methods:
            raise DraftTreeError("no method can run with these models: " + "; ".join(
                f"{m}: {r}" for m, r in self.skipped.items()))
        self.dtype = str(target.dtype).replace("torch.", "")
        self.device = str(target.device)

    def _drafter(self, method: str, ids, max_new: int):
        """A measurement-only drafter for one generation (the oracle)."""
        from drafttree.bench.oracle import oracle_drafter

        return oracle_drafter(self.lm, ids, max_new, method_parts(method)[1])

    def _variant_drafter(self, method: str):
        """For ``linears=torch`` a drafter of its own, built under torch's kernels (so its tree budget uses the
        verify-cost curve measured with them); None: the model's own drafter for the method."""
        name, opts, linears, head_dir, cached = method_parts(method)
        if linears is contextlib.nullcontext and head_dir is None:
            return None
        if method not in self._variants:
            from drafttree.drafters import make_drafter

            lm = self.lm
            if head_dir is None:
                head, resolved = lm.head, lm._resolve_method(name)
            else:  # the run's model may hold no head at all (--head none): resolve with this one
                head, resolved = self._other_head(head_dir), "hybrid" if name == "auto" else name
            self._variants[method] = make_drafter(resolved, lm.target, lm.draft, head, **opts)
            self._variants[method].keep_prefix(cached)
        return self._variants[method]

    def _other_head(self, path: str):
        """A ``head=DIR`` variant's head; it must read the target features the run's model exposes."""
        if path not in self._heads:
            from drafttree.heads import load_head_for

            head = load_head_for(self.lm.target, path, required=True)
            mine, run = getattr(head, "aux_layers", None), getattr(self.lm.head, "aux_layers", None)
            if mine != run:  # the target exposes one set of layers per run: --head's
                raise DraftTreeError(f"head={path} reads target layers {mine or 'last'}, --head reads "
                                     f"{run or 'last'}: compare heads that read the same layers")
            self._heads[path] = head
        return self._heads[path]

    # ---- one prompt -------------------------------------------------------------------------------------
    def answer(self, method: str, question: Question, seed: int, max_new_tokens: int | None = None,
               turns: int | None = None) -> list[dict]:
        """Answer the question's turns in order (earlier answers go back into the conversation)."""
        lm, cfg = self.lm, self.cfg
        if method not in HF_METHODS and method_parts(method).prefix_cache:
            lm = self.cached_lm
            lm.forget_prefix()  # a conversation's first turn is computed whole, as every method's
            drafter = self._variant_drafter(method)
            if drafter is not None:
                drafter.keep_prefix(True)
        max_new = max_new_tokens or cfg.max_new_tokens
        dev = lm.target.device
        messages: list[dict] = []
        out = []
        # the question's structured-output constraint (grammar.py), compiled once for transformers' methods
        grammar = lm.sampling(**question.constraint).grammar if question.constraint else None
        for i, user in enumerate(question.turns[: turns or len(question.turns)]):
            messages.append({"role": "user", "content": user})
            ids = lm.encode_prompt(messages)
            s = seed + i
            if method in HF_METHODS:
                _sync(dev)
                t0 = time.perf_counter()
                new, fwd = hf_generate(method, lm.target, ids, max_new, cfg.temperature, lm.eos_ids, s,
                                       draft=lm.draft, grammar=grammar)
                _sync(dev)
                wall = time.perf_counter() - t0
                text = lm.tokenizer.decode(new, skip_special_tokens=True)
                turn = {"prompt_tokens": int(ids.numel()), "new_tokens": len(new), "wall_time": wall,
                        "target_forwards": fwd, "accept_lengths": None, "time_split": None,
                        "finish_reason": "stop" if new and new[-1] in lm.eos_ids else "length",
                        "tokens": new, "text": text}
            else:
                _sync(dev)
                t0 = time.perf_counter()
                name, opts, linears, *_ = method_parts(method)
                with linears():
                    drafter = self._drafter(method, ids, max_new) if name in BENCH_METHODS else \
                        self._variant_drafter(method)
                    res = lm.generate(ids, max_new_tokens=max_new, temperature=cfg.temperature, seed=s, method=name,
                                      method_options=opts, drafter=drafter, **(question.constraint or {}))
                oracle = drafter if name in BENCH_METHODS else None
                _sync(dev)
                wall = time.perf_counter() - t0
                st = res.stats
                if oracle is not None:  # leave out the oracle's reference decoding
                    wall -= oracle.untimed
                    st.wall_time -= oracle.untimed
                    st.time_draft -= oracle.untimed
                text = res.text
                turn = {"prompt_tokens": int(ids.numel()), "cached_tokens": st.cached_tokens,
                        "new_tokens": st.new_tokens, "wall_time": wall,
                        "decode_wall_time": st.wall_time, "target_forwards": st.target_forwards,
                        "accept_lengths": list(st.accept_lengths),
                        "time_split": {"prefill": st.time_prefill, "draft": st.time_draft,
                                       "verify": st.time_verify, "other": st.time_other,
                                       "overhead": max(0.0, wall - st.wall_time)},
                        "finish_reason": st.finish_reason, "tokens": list(res.tokens), "text": text}
                used = drafter if drafter is not None else lm.drafter(name, opts)
                if hasattr(used, "source_accepts") and hasattr(used, "sources"):  # one tree, several sources
                    turn["source_accepts"] = {s.name: int(a) for s, a in zip(used.sources, used.source_accepts)}
            out.append(turn)
            messages.append({"role": "assistant", "content": text})
        return out

    def run_prompt(self, method: str, task: Task, q: Question) -> dict:
        base = {"method": method, "task": task.name, "question_id": q.question_id, "category": q.category,
                "family": "hf" if method in HF_METHODS else "drafttree"}
        seed = prompt_seed(self.cfg.seed, task.name, q.question_id)
        base["seed"] = seed
        try:
            reps = [self.answer(method, q, seed) for _ in range(self.cfg.repeats)]
        except Exception as e:  # noqa: BLE001 - one failing prompt must not end the run
            return {**base, "error": f"{type(e).__name__}: {e}"}
        tps = []
        for turns in reps:
            wall = sum(t["wall_time"] for t in turns)
            tps.append(sum(t["new_tokens"] for t in turns) / wall if wall > 0 else 0.0)
        from drafttree.bench.metrics import median_index

        turns = reps[median_index(tps)]
        rec = dict(base)
        rec["error"] = None
        rec["tokens_per_second"] = statistics.median(tps)
        rec["tokens_per_second_repeats"] = [round(x, 4) for x in tps]
        rec["new_tokens"] = sum(t["new_tokens"] for t in turns)
        rec["wall_time"] = sum(t["wall_time"] for t in turns)
        fwd = [t["target_forwards"] for t in turns]
        rec["target_forwards"] = None if None in fwd else sum(fwd)
        if method in HF_METHODS:
            rec["tau"] = rec["accept_lengths"] = rec["time_split"] = None
        else:
            acc = [a for t in turns for a in t["accept_lengths"]]
            rec["accept_lengths"] = acc
            rec["tau"] = sum(acc) / len(acc) if acc else None
            rec["time_split"] = {k: sum(t["time_split"][k] for t in turns) for k in turns[0]["time_split"]}
            if all("source_accepts" in t for t in turns):
                names = turns[0]["source_accepts"]
                rec["source_accepts"] = {k: sum(t["source_accepts"][k] for t in turns) for k in names}
        rec["identical_across_repeats"] = all([t["tokens"] for t in r] == [t["tokens"] for t in reps[0]]
                                              for r in reps)
        rec["turns"] = turns
        return rec

    def warm_up(self, method: str, task: Task) -> None:
        q = task.questions[0]
        for _ in range(self.cfg.warmup):
            try:
                self.answer(method, q, prompt_seed(self.cfg.seed, task.name, q.question_id),
                            max_new_tokens=min(self.cfg.max_new_tokens, 64), turns=1)
            except Exception as e:  # noqa: BLE001 - the real prompts will record the error
                self.note(f"warm-up of {method} failed: {type(e).__name__}: {e}")
                return


class Variant(NamedTuple):
    """A benchmark method spec, taken apart."""

    name: str
    opts: dict
    linears: Any  # a context manager: torch's linear kernels, or nothing
    head: str | None  # another head directory for this method, or None: the run's --head
    prefix_cache: bool = False  # a conversation's later turns reuse its earlier turns' keys (its first turn: none)


def method_parts(method: str) -> Variant:
    """A method spec's name, drafter options and the benchmark's own options, which put variants of one
    method side by side in one run: ``linears=torch`` (torch's linear kernels instead of the small-GEMM kernel:
    ``--methods auto,auto:linears=torch``) and ``head=DIR`` (another head than ``--head``, e.g. an old and a
    new head: ``--methods auto,auto:head=runs/new/head``) and ``prefix_cache=true`` (a question's later turns reuse
    the keys of its earlier turns, as a chat with ``prefix_cache`` does; its first turn is computed whole, as every
    other method's: ``--methods auto,auto:prefix_cache=true``)."""
    name, opts = parse_method(method)
    cached = opts.pop("prefix_cache", False)
    if cached not in (True, False):
        raise DraftTreeError(f"prefix_cache={cached!r} in {method!r}: choose true or false")
    linears = opts.pop("linears", "auto")
    if linears not in ("auto", "torch"):
        raise DraftTreeError(f"linears={linears!r} in {method!r}: choose auto or torch")
    head = opts.pop("head", None)
    return Variant(name, opts, torch_linears if linears == "torch" else contextlib.nullcontext,
                   None if head is None else str(head), cached)


def _load_tasks(cfg: BenchConfig) -> tuple[list[Task], list[str]]:
    """The tasks; a preset's task whose data is not here (alpaca) is skipped with a note, a named one fails."""
    if cfg.strict_tasks:
        return load_tasks(cfg.tasks, cfg.data_dir, cfg.prompts), []
    from drafttree.bench.tasks import EXTERNAL, task_path

    names, notes = [], []
    for name in cfg.tasks:
        if name in EXTERNAL:
            try:
                task_path(name, cfg.data_dir)
            except DraftTreeError as e:
                notes.append(f"skipping task {name}: {e}")
                continue
        names.append(name)
    if not names:
        raise DraftTreeError("no task left to run: " + "; ".join(notes))
    return load_tasks(names, cfg.data_dir, cfg.prompts), notes


def _run_state(cfg: BenchConfig, runner: BenchRunner) -> dict:
    return {"model": cfg.model, "draft_model": cfg.draft_model, "head": runner.head_path,
            "dtype": runner.dtype, "device": runner.device, "temperature": cfg.temperature,
            "max_new_tokens": cfg.max_new_tokens, "repeats": cfg.repeats, "seed": cfg.seed,
            "threads": runner.threads}


def _merge(a: list, b: list) -> list:
    return list(a) + [x for x in b if x not in a]


def run_bench(cfg: BenchConfig, out_dir: str | Path, command: str | None = None, overwrite: bool = False,
              show_progress: bool = True, plots: bool = True, log=None) -> dict:
    """Run (or resume) a benchmark into ``out_dir``; write summary.json, table.md and plots; return the summary."""
    from tqdm import tqdm

    from drafttree.bench.report import write_outputs

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise DraftTreeError(f"--out {out}: not a directory (a file of that name is in the way)") from None
    except PermissionError:
        raise DraftTreeError(f"--out {out}: no permission to create the run directory there") from None
    results_path, run_path = out / RESULTS, out / RUN_FILE
    tasks, task_notes = _load_tasks(cfg)  # validates every file before loading models
    if overwrite:
        for name in (RESULTS, RUN_FILE, SUMMARY):
            (out / name).unlink(missing_ok=True)
    prev = json.loads(run_path.read_text()) if run_path.exists() else None
    if prev is None and results_path.exists() and results_path.stat().st_size:
        raise DraftTreeError(f"{results_path} exists without {RUN_FILE}: use --overwrite or another --out")
    runner = BenchRunner(cfg, show_progress=show_progress, log=log)
    for msg in task_notes:
        runner.note(msg)
    runner.load()
    state = _run_state(cfg, runner)
    if prev is not None:
        diff = [f"{k}: {prev['state'].get(k)!r} then, {state[k]!r} now" for k in FINGERPRINT_KEYS
                if prev["state"].get(k) != state[k]]
        if diff:
            raise DraftTreeError(f"{out} holds a run with other settings ({'; '.join(diff)}): resume it with the "
                                 "same settings, or pass --overwrite or another --out")
    command = command or canonical_command(cfg, out)
    run = prev or {"schema": SCHEMA, "state": state, "commands": [], "methods": [], "tasks": [], "notes": [],
                   "skipped_methods": {}, "setting": cfg.setting, "quick": cfg.quick}
    if not run["commands"] or run["commands"][-1] != command:  # a resumed run records each new command line
        run["commands"].append(command)
    run["canonical_command"] = canonical_command(cfg, out)
    run["methods"] = _merge(run["methods"], runner.methods)
    run["tasks"] = _merge(run["tasks"], [t.name for t in tasks])
    run["task_files"] = {**run.get("task_files", {}), **{t.name: str(t.path) for t in tasks}}
    run["prompts_per_task"] = cfg.prompts
    run["warmup"] = cfg.warmup
    run["skipped_methods"] = {**run["skipped_methods"], **runner.skipped}
    run["notes"] = _merge(run["notes"], runner.notes)
    run["machine"] = machine_info(runner.threads, runner.dtype, runner.device)
    run_path.write_text(json.dumps(run, indent=1))

    repair_tail(results_path)
    done = done_keys(read_records(results_path))
    # methods interleaved per prompt: each prompt is answered by every method back to back, so a change
    # in machine load hits all methods alike instead of whichever ran at that time; tasks round-robin, so
    # a run stopped early (and resumed later) has covered every task evenly
    rounds = max(len(t.questions) for t in tasks)
    plan = [(m, t, t.questions[i]) for i in range(rounds) for t in tasks if i < len(t.questions)
            for m in runner.methods]
    todo = [(m, t, q) for m, t, q in plan if (m, t.name, q.question_id) not in done]
    if len(todo) < len(plan):
        runner.log(f"[bench] resuming: {len(plan) - len(todo)} of {len(plan)} prompts already recorded")
    bar = tqdm(total=len(plan), initial=len(plan) - len(todo), unit="prompt", desc="bench", dynamic_ncols=True,
               disable=not show_progress, file=sys.stderr)
    t_start = time.time()
    with open(results_path, "a", encoding="utf-8") as fh:
        for m in dict.fromkeys(m for m, _, _ in todo):
            bar.set_postfix_str(f"{m} warm-up")
            runner.warm_up(m, tasks[0])
        for m, t, q in todo:
            bar.set_postfix_str(f"{m} {t.name} {q.question_id}")
            rec = runner.run_prompt(m, t, q)
            if rec.get("error"):
                runner.log(f"[bench] {m} {t.name} {q.question_id} failed: {rec['error']}")
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            bar.update(1)
    bar.close()
    run["elapsed_s"] = round(run.get("elapsed_s", 0) + time.time() - t_start, 1)
    run_path.write_text(json.dumps(run, indent=1))
    return write_outputs(out, plots=plots)


__all__ = ["BenchConfig", "BenchRunner", "SETTINGS", "QUICK", "asdict", "resolve_config", "run_bench"]
