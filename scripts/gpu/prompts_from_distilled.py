"""Rebuild training prompts from distilled records: per id, the last turn's history (the user turns as written).

    python scripts/gpu/prompts_from_distilled.py DISTILLED.jsonl PROMPTS.jsonl

`drafttree data distill` answers each user turn with the target's own earlier answers as context, so the
assistant turns kept here are context only; the prompts come back in the distilled file's order.
"""

from __future__ import annotations

import json
import sys


def main(src: str, dst: str) -> None:
    last: dict[str, dict] = {}
    with open(src, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["id"] not in last or rec["turn"] > last[rec["id"]]["turn"]:
                last[rec["id"]] = rec
    with open(dst, "w", encoding="utf-8") as out:
        for pid, rec in last.items():
            messages = rec["messages"][:-1]  # the answer to the last turn is what distillation writes again
            if messages[-1]["role"] != "user":
                raise SystemExit(f"{src}: record {pid} does not end with an answer to a user turn")
            out.write(json.dumps({"id": pid, "messages": messages}, ensure_ascii=False) + "\n")
    print(f"{len(last)} prompts -> {dst}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
