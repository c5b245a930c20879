"""Insert this stop's run tables into docs/benchmarks.md (after the intro, before the first section) and copy plots."""
import re, shutil, sys
from pathlib import Path
DOC = Path("docs/benchmarks.md")
M = "AMD EPYC Zen 4 (AVX-512 with bf16)"
HH = "`METHOD:head=/work/main/runs/s53-headH-refit` is head H with its priors refitted by today's command"
SECTIONS = [  # (run dir, heading, kind)
    ("runs/s53-S-t0-heads", "Benchmark: smollm2-135m-instruct (setting S), T=0, 6 tasks x 5 prompts x 128 tokens, stop 53: head I (shipped since) next to head H (" + HH + "), and `eagle2` with the EAGLE-2 paper's 60-token trees, " + M, "bench"),
    ("runs/s53-heldout-heads", "Benchmark: smollm2-135m-instruct, T=0, the five held-out prompt classes (data/heldout/) x 4 prompts x 128 tokens, stop 53: head I next to head H, " + M, "bench"),
    ("runs/s53-S-t1-heads", "Benchmark: smollm2-135m-instruct (setting S), T=1, 6 tasks x 5 prompts x 128 tokens, stop 53: head I next to head H, " + M, "bench"),
    ("runs/s53-S-t0-live", "Benchmark: smollm2-135m-instruct (setting S), T=0, 6 tasks x 5 prompts x 128 tokens, stop 53: `auto` next to `auto:live_curve=true` (the verify-cost curve corrected by decoding's own verify times), " + M, "bench"),
    ("runs/s53-S-t1-live", "Benchmark: smollm2-135m-instruct (setting S), T=1, 6 tasks x 5 prompts x 128 tokens, stop 53: `auto` next to `auto:live_curve=true`, " + M, "bench"),
    ("runs/s53-heldout-live", "Benchmark: smollm2-135m-instruct, T=0, the five held-out prompt classes x 4 prompts x 128 tokens, stop 53: `auto` next to `auto:live_curve=true`, " + M, "bench"),
    ("runs/s53-L-live", "Benchmark: qwen2.5-coder-1.5b-instruct (setting L), T=0, 5 prompts x 128 tokens, stop 53: `auto` next to `auto:live_curve=true`, " + M, "bench"),
]
INTRO = Path("logs/s53_intro.md").read_text().strip() + "\n\n"

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
intro_at = doc.index("The first sections below (stop 52")
parts = []
for run, head, kind in SECTIONS:
    if Path(run).exists():
        parts.append(f"## {head}\n\n{body(run, kind)}\n")
    else:
        print("missing", run, file=sys.stderr)
new = doc[:intro_at] + INTRO + doc[intro_at:first] + "\n" + "\n".join(parts) + doc[first:]
DOC.write_text(new)
