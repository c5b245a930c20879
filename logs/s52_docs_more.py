"""Insert more of this stop's run tables at the top of docs/benchmarks.md's sections (usage: RUN 'HEADING' ...)."""
import sys
from pathlib import Path
sys.argv = sys.argv[:1] + sys.argv[1:]
exec(Path("logs/s52_docs.py").read_text().split("INTRO = ")[0])  # SECTIONS, M and helpers' imports
src = Path("logs/s52_docs.py").read_text()
body_src = src[src.index("def body"):src.index("doc = DOC.read_text()")]
exec(body_src)
doc = DOC.read_text()
first = doc.index("\n## ")
pairs = list(zip(sys.argv[1::2], sys.argv[2::2]))
parts = [f"## {head}, {M}\n\n{body(run, 'bench')}\n" for run, head in pairs]
DOC.write_text(doc[:first] + "\n" + "\n".join(parts) + doc[first:])
