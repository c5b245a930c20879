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
    points = []
    for h in progress.get("history", []):
        if "eval" not in h or not h["eval"]:
            continue
        threads = h.get("threads", summary.get("threads", assume_threads))
        if threads is None:
            raise DraftTreeError(f"{run} does not record its threads: pass --assume-threads N (what it ran with)")
        seconds = h.get("seconds", total * h["step"] / steps)
        ev = h["eval"]
        chain = ev.get("chain_all_correct", [])
        points.append({"step": h["step"], "cpu_hours": seconds * threads * processes / 3600,
                       "top1": ev["top1"][0], "steps_1_3": chain[2] if len(chain) > 2 else None,
                       "chain_tau": ev.get("expected_chain_tau"), "positions": ev.get("positions")})
    final = summary.get("eval")
    if final and (not points or points[-1]["step"] < steps):  # runs from before the last score was recorded
        threads = summary.get("threads", assume_threads)
        if threads is None:
            raise DraftTreeError(f"{run} does not record its threads: pass --assume-threads N (what it ran with)")
        chain = final.get("chain_all_correct", [])
        points.append({"step": steps, "cpu_hours": total * threads * processes / 3600, "top1": final["top1"][0],
                       "steps_1_3": chain[2] if len(chain) > 2 else None, "chain_tau": final.get("expected_chain_tau"),
                       "positions": final.get("positions")})
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
