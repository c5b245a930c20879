"""``drafttree bench``: one benchmark runner for our methods and Hugging Face's own generate.

    from drafttree.bench import resolve_config, run_bench
    summary = run_bench(resolve_config(quick=True), "runs/quick")

See :mod:`drafttree.bench.runner` (running, resume), :mod:`drafttree.bench.metrics` (speedup, tau,
losslessness), :mod:`drafttree.bench.report` (summary.json, table.md, plots, docs) and
:mod:`drafttree.bench.tasks` (question files).
"""

from drafttree.bench.config import BenchConfig, resolve_config
from drafttree.bench.runner import run_bench
from drafttree.bench.tasks import BUILTIN, load_task

__all__ = ["BUILTIN", "BenchConfig", "load_task", "resolve_config", "run_bench"]
