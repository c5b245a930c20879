"""``drafttree bench`` (run or resume a benchmark) and ``drafttree bench report`` (regenerate the document).

    drafttree bench [--setting S|L] [--quick] [--model M] [--draft-model D] [--head auto|none|DIR]
                    [--methods a,b,...] [--tasks t1,t2|FILE,...] [--data-dir DIR] [--temperature T]
                    [--max-new-tokens N] [--prompts N] [--repeats R] [--warmup W] [--dtype D] [--device D]
                    [--threads N] [--seed S] [--out DIR] [--overwrite] [--no-plots]
    drafttree bench report RUN_DIR [RUN_DIR ...] --out docs/benchmarks.md
    drafttree bench concurrency [--users 1,4,16,64] [--methods auto,ar,hf-ar] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import shlex
import sys
from pathlib import Path

from drafttree.errors import positive_int


class _RecordingParser(argparse.ArgumentParser):
    """Remembers the argument strings it parsed, so a run can record the exact command that produced it."""

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        ns.bench_argv = list(args) if args is not None else sys.argv[2:]
        return ns, extras


def _csv(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    out = [x.strip() for v in values for x in v.split(",") if x.strip()]
    return out or None


def cmd_bench(args) -> int:
    from drafttree.bench.config import resolve_config
    from drafttree.bench.runner import run_bench

    cfg = resolve_config(
        setting=args.setting, quick=args.quick, model=args.model, draft_model=args.draft_model, head=args.head,
        methods=_csv(args.methods), tasks=_csv(args.tasks), temperature=args.temperature,
        max_new_tokens=args.max_new_tokens, prompts=args.prompts, repeats=args.repeats, warmup=args.warmup,
        dtype=args.dtype, device=args.device, threads=args.threads, seed=args.seed, data_dir=args.data_dir,
    )
    out = args.out or f"runs/bench-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    argv = getattr(args, "bench_argv", None)
    command = None
    if argv is not None:
        command = "drafttree bench " + shlex.join(argv) if argv else "drafttree bench"
        if args.out is None:
            command += f" --out {shlex.quote(out)}"
    summary = run_bench(cfg, out, command=command, overwrite=args.overwrite, plots=not args.no_plots)
    print((Path(out) / "table.md").read_text())
    print(f"[bench] wrote {out}/results.jsonl, summary.json, table.md"
          + ("".join(f", {p}" for p in summary.get("plots", {}).values())), file=sys.stderr)
    return 0


def cmd_report(args) -> int:
    from drafttree.bench.report import render_report

    argv = getattr(args, "bench_argv", None)
    command = ("drafttree bench " + shlex.join(argv)) if argv else None
    render_report(args.runs, args.report_out, command=command)
    print(f"[bench] wrote {args.report_out}", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    from drafttree.bench.config import BENCH_METHODS, QUICK, SETTINGS
    from drafttree.bench.peers import HF_METHODS
    from drafttree.bench.tasks import BUILTIN
    from drafttree.drafters import METHODS

    b = sub.add_parser(
        "bench", help="benchmark methods on the EAGLE-2 task sets (resumable)",
        description="Run methods x tasks x prompts and write results.jsonl, summary.json, table.md and plots. "
                    "Running the same command again resumes an interrupted run.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="presets:\n" + "\n".join(
            f"  --setting {k}: model {v['model']}" + (f", draft {v['draft_model']}" if v["draft_model"] else "")
            + f"; tasks {','.join(v['tasks'])}; methods {','.join(v['methods'])}" for k, v in SETTINGS.items())
        + f"\n  --quick: {QUICK['prompts']} prompts/task, {QUICK['max_new_tokens']} new tokens, 1 repeat, 1 warm-up;"
          f" without --setting: methods {','.join(QUICK['methods'])}, tasks {','.join(QUICK['tasks'])}\n"
          "Methods needing a head or draft model that is missing are skipped in presets, an error when named.\n"
          "  drafttree bench report RUN_DIR [RUN_DIR ...] --out docs/benchmarks.md",
    )
    b.__class__ = _RecordingParser
    b.add_argument("--setting", choices=sorted(SETTINGS), default=None, help="preset (flags override it)")
    b.add_argument("--quick", action="store_true", help="smoke test: 2 prompts/task, 32 new tokens, 1 repeat")
    b.add_argument("--model", default=None, help="target (default smollm2-135m-instruct)")
    b.add_argument("--draft-model", default=None, help="draft LM for draft / hf-assisted (same tokenizer)")
    b.add_argument("--head", default=None, help="EAGLE head: auto (the shipped one, else the model's own MTP "
                   "layer), none, mtp, or a directory")
    b.add_argument("--methods", action="append", default=None,
                   help=f"comma-separated; ours: {', '.join(METHODS)}; measurement only: {', '.join(BENCH_METHODS)}; "
                        f"Hugging Face: {', '.join(HF_METHODS)}")
    b.add_argument("--tasks", action="append", default=None,
                   help=f"comma-separated built-in names ({', '.join(BUILTIN)}; also json: answers under a JSON "
                        "schema) or question-file paths")
    b.add_argument("--data-dir", default=None,
                   help="folder with alpaca.jsonl (default $DRAFTTREE_BENCH_DATA or ../shared/data/bench)")
    b.add_argument("--temperature", type=float, default=None, help="0 = greedy (default)")
    b.add_argument("--max-new-tokens", type=int, default=None, help="per turn (default 256)")
    b.add_argument("--prompts", type=int, default=None, help="first N questions of each task (default all)")
    b.add_argument("--repeats", type=int, default=None, help="timed runs per prompt, median kept (default 1)")
    b.add_argument("--warmup", type=int, default=None, help="untimed runs before each method (default 2)")
    b.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"])
    b.add_argument("--device", default=None, help="cpu, cuda, ... (default auto)")
    b.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads, fixed for the run")
    b.add_argument("--seed", type=int, default=None, help="base seed; each prompt's seed derives from it")
    b.add_argument("--out", default=None, help="run directory (default runs/bench-DATE)")
    b.add_argument("--overwrite", action="store_true", help="discard a previous run in --out instead of resuming")
    b.add_argument("--no-plots", action="store_true", help="skip the matplotlib plots")
    b.set_defaults(func=cmd_bench)

    rsub = b.add_subparsers(dest="bench_action", required=False)
    r = rsub.add_parser("report", help="regenerate the benchmark document from run directories")
    r.add_argument("runs", nargs="+", help="run directories (with summary.json)")
    r.add_argument("--out", dest="report_out", default="docs/benchmarks.md", help="Markdown file to write")
    r.set_defaults(func=cmd_report)

    from drafttree.bench.concurrency import add_parser as add_concurrency

    add_concurrency(rsub)


__all__ = ["add_parser", "cmd_bench", "cmd_report"]
