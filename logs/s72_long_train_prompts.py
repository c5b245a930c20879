"""Long prompts from the head's training prompts (data/distill.jsonl.xz), as a bench task file (diagnostic):
python logs/s72_long_train_prompts.py OUT N

Training prompts may be tuned on (the six tasks and data/heldout may not): the user turns of N single-turn training
prompts of 450-900 tokens, at most 3 from one source, drawn with a fixed seed, written as {"question_id", "category",
"turns"} lines for `drafttree bench --tasks OUT`."""
import json
import lzma
import random
import sys
from collections import Counter

import drafttree

out, n = sys.argv[1], int(sys.argv[2])
sm = drafttree.load(dtype="float32", show_progress=False)
tok = sm.tokenizer
with lzma.open("data/distill.jsonl.xz", "rt") as f:
    rows = [json.loads(x) for x in f]
pool = [r for r in rows if r["turn"] == 0 and 450 <= len(r["prompt_ids"]) <= 900]
random.Random(72).shuffle(pool)
per, picked = Counter(), []
for r in pool:
    src = r["id"].split(":")[0]
    text = tok.decode(r["prompt_ids"])
    start, end = text.rfind("<|im_start|>user\n"), text.rfind("<|im_end|>")
    if start < 0 or end < start or text.count("<|im_start|>user") != 1 or per[src] >= 3:
        continue
    per[src] += 1
    picked.append({"question_id": r["id"], "category": src, "turns": [text[start + len("<|im_start|>user\n"):end]]})
    if len(picked) == n:
        break
with open(out, "w") as f:
    for p in picked:
        f.write(json.dumps(p) + "\n")
print(len(picked), dict(per))
