"""Stop 80 diagnostic: where a lone sequence's drafting time goes, per round, by piece (perf_counter wrappers around
the drafter's and the sources' methods), `auto` alone, bf16, 2 threads:
python logs/s80_draft_split.py TEMPERATURE [TASKFILE N]

Without a task file: five chat prompts written for this (not benchmark prompts), 256 tokens each; with one: its first
N prompts (e.g. data/heldout/long_doc.jsonl 4). Run with PYTHONPATH=<worktree>/src to measure other code."""
import json
import sys
import time
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.drafters import hybrid, merged  # noqa: E402
from drafttree.sources import corpus, model_sources, ngram  # noqa: E402

acc = defaultdict(lambda: [0, 0.0])


def wrap(owner, name, label):
    real = getattr(owner, name)

    def timed(*a, **k):
        t = time.perf_counter()
        out = real(*a, **k)
        s = acc[label]
        s[0] += 1
        s[1] += time.perf_counter() - t
        return out

    setattr(owner, name, timed)


for owner, name, label in ((hybrid.HybridDrafter, "propose", "propose"), (hybrid.HybridDrafter, "observe", "observe"),
                           (corpus.CorpusSource, "propose", "corpus"), (ngram.NgramSource, "propose", "ngram"),
                           (model_sources.HeadSource, "propose", "head"), (merged.MergedTree, "add", "merged.add"),
                           (hybrid.HybridDrafter, "_size", "_size"), (hybrid.HybridDrafter, "_tree_of", "_tree_of"),
                           (hybrid.HybridDrafter, "_learn", "_learn")):
    wrap(owner, name, label)
temp = float(sys.argv[1])
prompts = ["Write a Python function that checks whether a string is a palindrome, then explain how it works.",
           "Explain how a refrigerator works to a ten-year-old.", "Write a short story about a lighthouse keeper.",
           "List five tips for writing clean code, with a sentence on each.",
           "Summarise the plot of Romeo and Juliet in one paragraph, then list its main characters."]
if len(sys.argv) > 2:
    with open(sys.argv[2]) as f:
        prompts = [json.loads(x)["turns"][0] for x in f][: int(sys.argv[3])]
sm = drafttree.load(dtype="bfloat16")
sm.generate(prompts[0], 16)  # warm-up
acc.clear()
tokens = forwards = 0
draft = wall = 0.0
for i, p in enumerate(prompts):
    r = sm.generate(p, 256, temperature=temp, seed=i)
    tokens, forwards = tokens + r.new_tokens, forwards + r.target_forwards
    draft, wall = draft + r.stats.time_draft, wall + r.wall_time
code = drafttree.__file__.split("/src/")[0]
print(f"T={temp} {code}: tokens {tokens} forwards {forwards} tau {tokens / forwards:.2f}"
      f" tok/s {tokens / wall:.1f} drafting {1000 * draft / forwards:.2f} ms/round ({draft / wall:.0%} of the wall)")
for k, (c, t) in sorted(acc.items(), key=lambda x: -x[1][1]):
    print(f"  {k:10s} calls {c:5d}  {1000 * t / forwards:.3f} ms/round  {1000 * t / max(1, c):.3f} ms/call")
