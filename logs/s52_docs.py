"""Insert this stop's run tables into docs/benchmarks.md (after the intro, before the first section) and copy plots."""
import re, shutil, sys
from pathlib import Path
DOC = Path("docs/benchmarks.md")
M = "AMD EPYC Zen 4 (AVX-512 with bf16)"
SECTIONS = [  # (run dir, heading, kind)
    ("runs/s52-L-20", "Benchmark: qwen2.5-coder-1.5b-instruct (setting L), T=0, 1 task x 20 prompts x 256 tokens (issue 10's L done-when run at full size without the two `hf-*` methods), stop 52, " + M, "bench"),
    ("runs/s52-S-t0-base", "Benchmark: smollm2-135m-instruct (setting S), T=0, 6 tasks x 5 prompts x 128 tokens, stop 52 (this machine's first run: `hf-ar`, `ar`, `lookup`, `auto`), " + M, "bench"),
    ("runs/s52-S-t0-ggate", "Benchmark: smollm2-135m-instruct (setting S), T=0, 6 tasks x 5 prompts x 128 tokens, stop 52: `auto` next to `auto:greedy_gate=true` (opt-in), " + M, "bench"),
    ("runs/s52-heldout-ggate", "Benchmark: smollm2-135m-instruct, T=0, the five held-out prompt classes (data/heldout/) x 4 prompts x 128 tokens, stop 52: `auto` next to `auto:greedy_gate=true`, " + M, "bench"),
    ("runs/s52-L-ggate", "Benchmark: qwen2.5-coder-1.5b-instruct (setting L), T=0, 5 prompts x 128 tokens, stop 52: `auto` next to `auto:greedy_gate=true`, " + M, "bench"),
    ("runs/s52-S-t0-clock", "Benchmark: smollm2-135m-instruct (setting S), T=0, 6 tasks x 5 prompts x 128 tokens, stop 52: `auto` with the costly sources' level costs corrected by the clock (`clock_cost`, on during this run) next to `auto:clock_cost=false` (the default since), " + M, "bench"),
    ("runs/concurrency-s52-base", "Many users: 1, 4, 16 and 64 at once, three interleaved runs each (median), and the same requests one at a time, stop 52, " + M, "conc"),
    ("runs/concurrency-s52-1-ggate", "Many users: one user (the free-text prompt), `auto` next to `auto:greedy_gate=true`, five interleaved runs, stop 52, " + M, "conc"),
]
INTRO = Path("logs/s52_intro.md").read_text().strip() + "\n\n"

def body(run: str, kind: str) -> str:
    d = Path(run)
    name = d.name
    if kind == "bench":
        text = (d / "table.md").read_text()
        text = "\n".join(text.splitlines()[1:]).strip()  # drop the "# Benchmark" title
        for img in ("speedup", "tau_hist"):
            if (d / f"{img}.png").exists():
                shutil.copy(d / f"{img}.png", f"docs/img/{name}-{img}.png")
            text = text.replace(f"]({img}.png)", f"](img/{name}-{img}.png)")
    else:
        text = (d / "concurrency.md").read_text().strip()
        if (d / "concurrency.png").exists():
            shutil.copy(d / "concurrency.png", f"docs/img/{name}.png")
            text += f"\n\n![aggregate tokens/s against users](img/{name}.png)"
    return text

doc = DOC.read_text()
first = doc.index("\n## ")
intro_at = doc.index("The first sections below (stop 51")
parts = []
for run, head, kind in SECTIONS:
    if Path(run).exists():
        parts.append(f"## {head}\n\n{body(run, kind)}\n")
    else:
        print("missing", run, file=sys.stderr)
new = doc[:intro_at] + INTRO + doc[intro_at:first] + "\n" + "\n".join(parts) + doc[first:]
DOC.write_text(new)
