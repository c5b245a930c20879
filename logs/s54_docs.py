"""Insert this stop's run tables into docs/benchmarks.md (after the intro, before the first section), the status table
at the top of the intro, and copy plots (stop 53's logs/s53_docs.py, this stop's runs)."""
import shutil
import sys
from pathlib import Path

DOC = Path("docs/benchmarks.md")
M = "AMD EPYC Zen 4 (AVX-512 with bf16)"
SECTIONS = [  # (run dir, heading, kind)
    ("runs/s54-S-t0-20", "Benchmark: smollm2-135m-instruct (setting S), T=0, 6 tasks x 20 prompts x 256 tokens (issue 10's S done-when run at full size, the seven methods it names), stop 54, " + M, "bench"),
    ("runs/s54-S-t1-10", "Benchmark: smollm2-135m-instruct (setting S), T=1, 6 tasks x 10 prompts x 256 tokens (issue 10's T=1 done-when run at full size, without `lookup`), stop 54, " + M, "bench"),
    ("runs/concurrency-s54-rotary", "Many users at once, 1 / 16 users, stop 54, after a prompt's rotary embeddings went through torch's ops (commit cc48e03), " + M, "concurrency"),
    ("runs/concurrency-s54", "Many users at once, 1 / 4 / 16 / 64 users, stop 54 (before the rotary change), " + M, "concurrency"),
]
INTRO = Path("logs/s54_intro.md").read_text().strip() + "\n\n"
STATUS = Path("logs/s54_status.md").read_text().strip() + "\n\n"


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
intro_at = doc.index("The first sections below (stop 53")
read_at = doc.index("How to read these tables")
parts = []
for run, head, kind in SECTIONS:
    if Path(run).exists():
        parts.append(f"## {head}\n\n{body(run, kind)}\n")
    else:
        print("missing", run, file=sys.stderr)
new = doc[:read_at] + STATUS + doc[read_at:intro_at] + INTRO + doc[intro_at:first] + "\n" + "\n".join(parts) + doc[first:]
DOC.write_text(new)
