"""Outputs of a run (summary.json, table.md, plots) and the ``docs/benchmarks.md`` report over runs."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from drafttree.bench.files import RESULTS, RUN_FILE, SUMMARY, read_records
from drafttree.bench.metrics import MEAN, summarize_results
from drafttree.bench.tasks import DISPLAY
from drafttree.errors import DraftTreeError

PLOTS = {"speedup": "speedup.png", "tau_hist": "tau_hist.png"}
DASH = "—"


# ---------------------------------------------------------------------------------------------- summary


def build_summary(run: dict, records: list[dict]) -> dict:
    temperature = run["state"]["temperature"]
    core = summarize_results(records, run["methods"], run["tasks"], temperature)
    cfg = dict(run["state"])
    cfg.update(methods=run["methods"], tasks=run["tasks"], prompts_per_task=run.get("prompts_per_task"),
               warmup=run.get("warmup"), setting=run.get("setting"), quick=run.get("quick"),
               task_files=run.get("task_files", {}))
    return {
        "schema": run.get("schema"),
        "command": run["commands"][-1] if run.get("commands") else None,
        "commands": run.get("commands", []),
        "canonical_command": run.get("canonical_command"),
        "date": run.get("machine", {}).get("date"),
        "machine": run.get("machine", {}),
        "config": cfg,
        "skipped_methods": run.get("skipped_methods", {}),
        "notes": run.get("notes", []),
        "elapsed_s": run.get("elapsed_s"),
        "methods": [m for m in run["methods"] if m in core["results"]],
        "tasks": run["tasks"],
        **core,
    }


def write_outputs(out_dir: str | Path, plots: bool = True) -> dict:
    """(Re)compute summary.json, table.md and the plots of a run directory from run.json + results.jsonl."""

    out = Path(out_dir)
    if not (out / RUN_FILE).exists():
        raise DraftTreeError(f"{out} is not a benchmark run directory (no {RUN_FILE})")
    run = json.loads((out / RUN_FILE).read_text())
    summary = build_summary(run, read_records(out / RESULTS))
    summary["plots"] = {}
    if plots:
        summary["plots"] = write_plots(summary, out)
    (out / SUMMARY).write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    (out / "table.md").write_text(render_run(summary, heading_level=1, img_prefix=""))
    return summary


# ----------------------------------------------------------------------------------------------- tables


def _fmt(x, spec: str, suffix: str = "") -> str:
    return DASH if x is None else f"{format(x, spec)}{suffix}"


def _cols(summary: dict) -> list[str]:
    return list(summary["tasks"]) + [MEAN]


def _head(summary: dict, first: str) -> list[str]:
    names = [DISPLAY.get(t, t) for t in summary["tasks"]] + ["Mean"]
    return [f"| {first} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]


def speedup_table(summary: dict) -> str:
    """EAGLE-2-paper style: rows = methods, cells = "speedup (tau)"."""
    lines = _head(summary, "Method")
    for m in summary["methods"]:
        cells = []
        for t in _cols(summary):
            r = summary["results"][m].get(t) or {}
            if not r.get("prompts"):
                cells.append(DASH)
                continue
            cells.append(f"{_fmt(r.get('speedup'), '.2f', 'x')} ({_fmt(r.get('tau'), '.2f')})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def metric_table(summary: dict, key: str, spec: str, suffix: str = "") -> str:
    lines = _head(summary, "Method")
    for m in summary["methods"]:
        cells = [_fmt((summary["results"][m].get(t) or {}).get(key), spec, suffix) for t in _cols(summary)]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lossless_table(summary: dict) -> str:
    lines = _head(summary, "Method")
    for m in summary["methods"]:
        cells = []
        for t in _cols(summary):
            r = summary["results"][m].get(t) or {}
            same, n = r.get("identical_prompts"), r.get("compared_prompts")
            cells.append(DASH if same is None else f"{same}/{n}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def split_table(summary: dict) -> str:
    from drafttree.bench.metrics import SPLIT_KEYS

    by_source = any(summary["results"][m][MEAN].get("source_tau") for m in summary["methods"])
    extra = " drafts accepted per forward, by source |" if by_source else ""
    lines = ["| Method | τ | forwards/token | " + " | ".join(SPLIT_KEYS) + " |" + extra,
             "|---" * (len(SPLIT_KEYS) + 3 + by_source) + "|"]
    for m in summary["methods"]:
        r = summary["results"][m][MEAN]
        fr = r.get("time_split_fraction")
        cells = [_fmt(100 * fr[k], ".0f", "%") if fr else DASH for k in SPLIT_KEYS]
        if by_source:
            st = r.get("source_tau")
            cells.append(", ".join(f"{k} {v:.2f}" for k, v in st.items()) if st else DASH)
        lines.append(f"| {m} | {_fmt(r.get('tau'), '.2f')} | {_fmt(r.get('target_forwards_per_token'), '.3f')} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def _machine_line(summary: dict) -> str:
    mi, c = summary.get("machine", {}), summary["config"]
    hw = mi.get("gpu") or mi.get("cpu")
    return (f"{hw}, {mi.get('threads')} threads ({mi.get('cpu_count')} CPUs), {c.get('dtype')} on {c.get('device')}; "
            f"torch {mi.get('torch')}, transformers {mi.get('transformers')}, python {mi.get('python')}; "
            f"{mi.get('date')}")


def render_run(summary: dict, heading_level: int = 2, img_prefix: str = "", title: str | None = None) -> str:
    c = summary["config"]
    h = "#" * heading_level
    base = summary.get("baseline")
    n_tasks = len(summary.get("tasks") or [])
    asked = c.get("prompts_per_task") or "all"
    counts = [cell.get("prompts", 0) for r in summary["results"].values() for t, cell in r.items() if t != MEAN]
    done = min(counts) if counts else 0
    prompts = f"{done} prompts" + ("" if asked == "all" or done >= asked else f" (of {asked} asked: stopped early)")
    size = f"T={c['temperature']:g}, {n_tasks} task{'s' if n_tasks != 1 else ''} x {prompts} x " \
           f"{c['max_new_tokens']} tokens"
    title = title or f"Benchmark: {c['model']}" + (f" (setting {c['setting']})" if c.get("setting") else "") + (
        " — quick" if c.get("quick") else "") + f", {size}"
    out = [f"{h} {title}", ""]
    cmds = summary.get("commands") or []
    out += ["Command" + ("s (resumed run)" if len(cmds) > 1 else "") + ":", "", "```sh", *cmds, "```", ""]
    out += [f"- Machine: {_machine_line(summary)}",
            f"- Target `{c['model']}`" + (f", draft `{c['draft_model']}`" if c.get("draft_model") else "")
            + (f", head `{c['head']}`" if c.get("head") else ", no EAGLE head"),
            f"- Temperature {c['temperature']}, max new tokens {c['max_new_tokens']}, "
            f"prompts per task {c.get('prompts_per_task') or 'all'}, repeats {c['repeats']} (median per prompt), "
            f"warm-up runs {c.get('warmup')}, seed {c['seed']}",
            f"- Speedup baseline: `{base}` (ratio of mean per-prompt tokens/s); τ = mean tokens per target forward"]
    for m, why in (summary.get("skipped_methods") or {}).items():
        out.append(f"- Skipped `{m}`: {why}")
    for note in summary.get("notes") or []:
        if not any(note.startswith(f"skipping {m}:") for m in summary.get("skipped_methods") or {}):
            out.append(f"- Note: {note}")
    failed = {m: r[MEAN]["failed"] for m, r in summary["results"].items() if r[MEAN]["failed"]}
    if failed:
        out.append("- Failed prompts (see results.jsonl): " + ", ".join(f"{m} {n}" for m, n in failed.items()))
    out += ["", f"**Speedup vs `{base}` (τ)**", "", speedup_table(summary), ""]
    if any(m in summary["results"] for m in ("ar",)) and base != "ar":
        out += ["**Speedup vs our `ar`**", "", metric_table(summary, "speedup_vs_ar", ".2f", "x"), ""]
    out += ["**Tokens per second** (mean of per-prompt tokens/s)", "",
            metric_table(summary, "tokens_per_second", ".1f"), "",
            "**Pooled tokens per second** (all new tokens over all wall time of a task: each token weighs the same, "
            "so a sampled answer that stopped after a few tokens does not weigh like a long one)", "",
            metric_table(summary, "pooled_tokens_per_second", ".1f"), ""]
    ref = summary.get("lossless_reference")
    if ref:
        note = "" if c.get("dtype") == "float32" else (
            f" In {c.get('dtype')}, kernels that verify several tokens at once can round differently from one-token "
            "steps and flip near-ties; float32 is exact.")
        if c.get("temperature", 0) > 0:
            note += (" Sampling: every method gets the prompt's seed, which fixes each position's sample, so ours give "
                     "`ar`'s text; `hf-*` sample from transformers' own random stream and are not compared.")
        out += [f"**Identical outputs** (prompts whose tokens equal `{ref}`'s, every turn){note}", "",
                lossless_table(summary), ""]
        for m in summary["methods"]:
            divs = [(t, d) for t in summary["tasks"] for d in (summary["results"][m].get(t) or {}).get("divergences")
                    or []]
            if divs:
                shown = ", ".join(f"{t} #{d['question_id']} turn {d['turn'] + 1} token {d['position']}"
                                  for t, d in divs[:6])
                out.append(f"- `{m}` first divergences: {shown}{' ...' if len(divs) > 6 else ''}")
        out.append("")
    out += ["**Mean τ, target forwards per token and time split** (fractions of wall time; overhead = API time "
            "outside the decode loop)", "", split_table(summary), ""]
    plots = summary.get("plots") or {}
    for key, label in (("speedup", "speedup per task"), ("tau_hist", "accepted lengths")):
        if plots.get(key):
            out += [f"![{label}]({img_prefix}{plots[key]})", ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ plots


def write_plots(summary: dict, out_dir: Path) -> dict:
    """speedup.png (bars per task and method) and tau_hist.png (accepted-length histograms per method)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib is not installed: no plots (pip install 'drafttree[bench]')")
        return {}
    written = {}
    methods, cols = summary["methods"], _cols(summary)
    res = summary["results"]
    if methods:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(cols) * max(1, len(methods)) / 3 + 2), 4))
        width = 0.8 / len(methods)
        top = max([(res[m].get(t) or {}).get("speedup") or 0.0 for m in methods for t in cols] + [1.0])
        ax.set_ylim(0, top * 1.3)
        for i, m in enumerate(methods):
            vals = [(res[m].get(t) or {}).get("speedup") or 0.0 for t in cols]
            xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(cols))]
            ax.bar(xs, vals, width, label=m)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels([DISPLAY.get(t, "Mean" if t == MEAN else t) for t in cols])
        ax.set_ylabel(f"speedup vs {summary.get('baseline')}")
        c = summary["config"]
        ax.set_title(f"{c['model']} · T={c['temperature']} · {c.get('dtype')}", fontsize=10)
        ax.legend(fontsize=8, ncol=min(6, len(methods)), loc="upper left")
        fig.tight_layout()
        fig.savefig(out_dir / PLOTS["speedup"], dpi=110)
        plt.close(fig)
        written["speedup"] = PLOTS["speedup"]
    ours = [m for m in methods if res[m][MEAN].get("accept_length_hist")]
    if len(ours) > 1:  # plain decoding's histogram is a single bar at 1
        ours = [m for m in ours if m != "ar"]
    if ours:
        n = len(ours)
        ncol = min(3, n)
        nrow = (n + ncol - 1) // ncol
        fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 2.8 * nrow), squeeze=False)
        for k, m in enumerate(ours):
            ax = axes[k // ncol][k % ncol]
            hist = {int(a): v for a, v in res[m][MEAN]["accept_length_hist"].items()}
            total = sum(hist.values()) or 1
            xs = list(range(1, max(hist) + 1))
            ax.bar(xs, [hist.get(x, 0) / total for x in xs], color="tab:blue")
            tau = res[m][MEAN].get("tau")
            ax.set_title(f"{m}  (mean τ over tasks = {tau:.2f})" if tau is not None else m, fontsize=10)
            ax.set_xlabel("tokens per target forward")
            ax.set_ylabel("fraction of forwards")
            ax.set_xticks(xs)
        for k in range(n, nrow * ncol):
            axes[k // ncol][k % ncol].axis("off")
        fig.tight_layout()
        fig.savefig(out_dir / PLOTS["tau_hist"], dpi=110)
        plt.close(fig)
        written["tau_hist"] = PLOTS["tau_hist"]
    return written


# ----------------------------------------------------------------------------------------------- report

METHODOLOGY = """\
How to read these tables (the conventions of Spec-Bench and EAGLE's `speed.py`):

- Every prompt is answered turn by turn (MT-bench has two turns; the earlier answer goes back into the
  conversation) with the target's chat template, batch size 1, stopping at EOS or the max new tokens.
- Per prompt, tokens/s = Σ new tokens / Σ wall time over its turns (median over repeats). A method's
  tokens/s on a task is the mean over prompts; **speedup** = that mean divided by the baseline's mean over
  the same prompts (a ratio of means). The Mean column averages the per-task values.
- **τ** = mean tokens produced per target forward (accepted draft tokens + the target's own token),
  pooled over all forwards of a task; 1.00 for plain decoding. Hugging Face's methods do not expose it (—).
- `hf-ar`, `hf-lookup`, `hf-assisted` are `transformers`' own `generate` (plain, prompt lookup with 10
  candidate tokens, assisted generation) run in the same process on the same loaded model.
- **Identical outputs**: at T=0 the tokens of every turn are compared with plain decoding (`ar`, else
  `hf-ar`); a lossless method matches on every prompt in float32. At T>0 (since stop 38) our methods are compared
  with our `ar`: a prompt's seed is the same for every method and fixes each position's sample.
"""


def render_report(run_dirs: list[str | Path], out_md: str | Path, command: str | None = None) -> str:
    """Regenerate the benchmark document from run directories; copies their plots into ``<out dir>/img``."""

    if not run_dirs:
        raise DraftTreeError("bench report needs at least one run directory")
    out_md = Path(out_md)
    img_dir = out_md.parent / "img"
    sections = []
    used: set[str] = set()
    for d in run_dirs:
        d = Path(d)
        if (d / "concurrency.json").exists():
            from drafttree.bench.concurrency import render_section

            sections.append(render_section(d, img_dir, d.resolve().name or "concurrency"))
            continue
        if not (d / SUMMARY).exists():
            if (d / RESULTS).exists():
                write_outputs(d)
            else:
                raise DraftTreeError(f"{d} holds no {SUMMARY}: not a benchmark run directory")
        summary = json.loads((d / SUMMARY).read_text())
        slug = d.resolve().name or "run"
        while slug in used:
            slug += "_"
        used.add(slug)
        plots = {}
        for key, name in (summary.get("plots") or {}).items():
            src = d / name
            if src.exists():
                img_dir.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, img_dir / f"{slug}-{name}")
                plots[key] = f"{slug}-{name}"
        summary["plots"] = plots
        sections.append(render_run(summary, heading_level=2, img_prefix="img/"))
    cmd = command or "drafttree bench report " + " ".join(shlex.quote(str(d)) for d in run_dirs) + \
        f" --out {shlex.quote(str(out_md))}"
    text = "\n".join([
        "# Benchmarks", "",
        f"<!-- generated by `{cmd}`; edit the runs, not this file -->", "",
        METHODOLOGY, *sections,
    ])
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(text)
    return text
