"""Keep the complete JSON lines of a distill file that a timeout cut mid-line.

    python scripts/gpu/complete_lines.py CUT.jsonl CLEAN.jsonl
"""

from __future__ import annotations

import json
import sys


def main(src: str, dst: str) -> None:
    kept = 0
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for line in f:
            try:
                json.loads(line)
            except json.JSONDecodeError:
                continue
            out.write(line if line.endswith("\n") else line + "\n")
            kept += 1
    print(f"{kept} records kept -> {dst}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
