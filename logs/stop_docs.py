"""Put a stop's results into docs/benchmarks.md (replacing stops 52-55's per-stop copies, in git history): the status
table at the top replaced by logs/sNN_status.md, logs/sNN_intro.md added before the previous stops' intros, and the
run tables of logs/sNN_sections.json ([[run dir, heading, "bench" | "concurrency"], ...]) inserted before the first
section, their plots copied to docs/img. Usage: python logs/stop_docs.py 56"""
import json
import shutil
import sys
from pathlib import Path

stop = sys.argv[1]
DOC = Path("docs/benchmarks.md")
sections = json.loads(Path(f"logs/s{stop}_sections.json").read_text()) if Path(
    f"logs/s{stop}_sections.json").exists() else []
intro = Path(f"logs/s{stop}_intro.md").read_text().strip() + "\n\n"
status = Path(f"logs/s{stop}_status.md").read_text().strip() + "\n\n"


def body(run: str, kind: str) -> str:
    d = Path(run)
    if kind == "bench":
        text = "\n".join((d / "table.md").read_text().splitlines()[1:]).strip()  # without its "# Benchmark" title
        for img in ("speedup", "tau_hist"):
            if (d / f"{img}.png").exists():
                shutil.copy(d / f"{img}.png", f"docs/img/{d.name}-{img}.png")
            text = text.replace(f"]({img}.png)", f"](img/{d.name}-{img}.png)")
        return text
    text = (d / "concurrency.md").read_text().strip()
    if (d / "concurrency.png").exists():
        shutil.copy(d / "concurrency.png", f"docs/img/{d.name}.png")
        text += f"\n\n![aggregate tokens/s against users](img/{d.name}.png)"
    return text


doc = DOC.read_text()
at, end = doc.index("**Where the issues' done-when goals stand**"), doc.index("How to read these tables")
doc = doc[:at] + status + doc[end:]
first, intro_at = doc.index("\n## "), doc.index("The first sections below (stop ")
parts = [f"## {head}\n\n{body(run, kind)}\n" for run, head, kind in sections if Path(run).exists()]
for run, _, _ in sections:
    if not Path(run).exists():
        print("missing", run, file=sys.stderr)
DOC.write_text(doc[:intro_at] + intro + doc[intro_at:first] + "\n" + "\n".join(parts) + doc[first:])
