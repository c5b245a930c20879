"""Held-out accuracy against CPU-hours for training runs (``drafttree train-curves``).

Issue 12 asks what a head's accuracy costs on a given machine: every held-out evaluation a run records carries the
wall seconds, tokens and threads it had used by then, so runs of different kinds (EAGLE-1 / EAGLE-3, from scratch
or continued) compare on one axis. Runs written before those fields existed are placed by their summary's total
seconds, spread evenly over the steps (their steps take the same time each), with the threads given by the caller.
"""

from __future__ import annotations

import json
from pathlib import Path

from drafttree.errors import DraftTreeError


def run_points(run: str | Path, assume_threads: int | None = None) -> list[dict]:
    """The held-out evaluations of one run, each with its CPU-hours (wall seconds x threads x processes)."""
    run = Path(run)
    prog_path = run / "checkpoint" / "progress.json"
    if not prog_path.exists():
        raise DraftTreeError(f"{run} is not a training run (no checkpoint/progress.json)")
    progress = json.loads(prog_path.read_text())
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    steps = summary.get("steps") or progress.get("step") or 1
    total = summary.get("train_seconds", progress.get("seconds", 0.0))
    processes = summary.get("processes", 1)
    entries = [h for h in progress.get("history", []) if h.get("eval")]
    final = summary.get("eval")
    if final and (not entries or (entries[-1]["step"] < steps and entries[-1]["eval"] != final)):
        entries.append({"step": steps, "eval": final, "seconds": total})  # runs from before the last score was
        # kept in the history (an older summary repeating the last periodic score is not a new point)
    by_step = {}
    for h in entries:  # one point per step (an epoch's end can fall on an --eval-every step)
        threads = h.get("threads", assume_threads if assume_threads is not None else summary.get("threads"))
        if threads is None:
            raise DraftTreeError(f"{run} does not record its threads: pass --assume-threads N (what it ran with)")
        seconds = h.get("seconds", total * h["step"] / steps)
        ev, chain = h["eval"], h["eval"].get("chain_all_correct", [])
        by_step[h["step"]] = {"step": h["step"],
                              "cpu_hours": seconds * threads * h.get("processes", processes) / 3600,
                              "top1": ev["top1"][0], "steps_1_3": chain[2] if len(chain) > 2 else None,
                              "chain_tau": ev.get("expected_chain_tau"), "positions": ev.get("positions")}
    points = [by_step[k] for k in sorted(by_step)]
    if not points:
        raise DraftTreeError(f"{run} has no held-out evaluation yet (see --eval-every)")
    return points


def describe(run: str | Path) -> str:
    """A label for a run: its head kind, and the head it continued if any."""
    cfg = json.loads((Path(run) / "checkpoint" / "progress.json").read_text()).get("config", {})
    kind = "EAGLE-3" if cfg.get("head_kind") == "eagle3" else "EAGLE-1"
    init = cfg.get("init_head")
    return f"{Path(run).name} ({kind}{', continued from ' + Path(init).name if init else ', from scratch'})"


def markdown_table(curves: dict[str, list[dict]]) -> str:
    lines = ["| run | step | CPU-hours | step-1 top-1 | steps 1..3 all right | expected chain tau |",
             "|---|---|---|---|---|---|"]
    for label, pts in curves.items():
        for p in pts:
            s13 = "-" if p["steps_1_3"] is None else f"{p['steps_1_3']:.3f}"
            lines.append(f"| {label} | {p['step']} | {p['cpu_hours']:.2f} | {p['top1']:.3f} | {s13} | "
                         f"{p['chain_tau']:.3f} |")
    return "\n".join(lines)


def plot(curves: dict[str, list[dict]], out: str | Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DraftTreeError("--plot needs matplotlib: pip install 'drafttree[bench]'") from None

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for label, pts in curves.items():
        x = [p["cpu_hours"] for p in pts]
        axes[0].plot(x, [p["top1"] for p in pts], marker="o", label=label)
        axes[1].plot(x, [p["chain_tau"] for p in pts], marker="o", label=label)
    axes[0].set_ylabel("held-out step-1 top-1")
    axes[1].set_ylabel("held-out expected chain tau")
    for ax in axes:
        ax.set_xlabel("CPU-hours (wall hours x threads)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
