"""Insert this stop's run tables into docs/benchmarks.md (after the intro, before the first section), replace the
status table at the top, add the intro paragraph, copy plots (stop 54's logs/s54_docs.py, this stop's runs)."""
import shutil
import sys
from pathlib import Path

DOC = Path("docs/benchmarks.md")
M = "AMD EPYC Zen 4 (AVX-512 with bf16)"
SECTIONS = [  # (run dir, heading, kind)
    ("runs/s55-L-hf-20", "Benchmark: qwen2.5-coder-1.5b-instruct (setting L), T=0, HumanEval 20 prompts x 256 tokens, against transformers' own methods (issue 10's `hf-assisted` goal at full size), stop 55, " + M, "bench"),
    ("runs/concurrency-s55", "Many users at once, 1 / 4 / 16 / 64 users, stop 55, after the batch's measured forward and newcomers prefilled into their rows, " + M, "concurrency"),
    ("runs/s55-conc-batchpass", "Many users at once: the shipped head's batch pass (`auto:batch_pass=true`) at 4 / 16 users, stop 55, " + M, "concurrency"),
]
INTRO = Path("logs/s55_intro.md").read_text().strip() + "\n\n"
STATUS = Path("logs/s55_status.md").read_text().strip() + "\n\n"


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
status_at = doc.index("**Where the issues' done-when goals stand**")
read_at = doc.index("How to read these tables")
doc = doc[:status_at] + STATUS + doc[read_at:]
first = doc.index("\n## ")
intro_at = doc.index("The first sections below (stop 54")
parts = []
for run, head, kind in SECTIONS:
    if Path(run).exists():
        parts.append(f"## {head}\n\n{body(run, kind)}\n")
    else:
        print("missing", run, file=sys.stderr)
new = doc[:intro_at] + INTRO + doc[intro_at:first] + "\n" + "\n".join(parts) + doc[first:]
DOC.write_text(new)
