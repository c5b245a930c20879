"""Where a lone sequence's drafting time goes at T=1 on long prompts (diagnostic):
python logs/s72_t1_draft_split.py TASKFILE N METHOD...

The first N prompts of a bench task file (logs/s72_long_train.jsonl: long training prompts), 256 tokens at T=1, seed
i for prompt i, each METHOD in turn; per method: tokens/s, τ, rounds, and the rounds of HybridDrafter.propose by
outcome (gated: the draft gate closed; root: it drafted nothing beyond the root; tree: a tree of more than one node),
with the mean milliseconds of propose and the tokens each committed."""
import json
import sys
import time
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.drafters.hybrid import HybridDrafter  # noqa: E402

path, n, methods = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
with open(path) as f:
    prompts = [json.loads(x)["turns"][0] for x in f][:n]
sm = drafttree.load(dtype="bfloat16")
stat = defaultdict(lambda: [0, 0.0])
real = HybridDrafter.propose


def propose(self, req):
    t0 = time.perf_counter()
    tree = real(self, req)
    kind = "gated" if req.info.get("gated") else ("root" if tree.size == 1 else "tree")
    s = stat[kind]
    s[0] += 1
    s[1] += time.perf_counter() - t0
    return tree


HybridDrafter.propose = propose
sm.generate(prompts[0], max_new_tokens=16, temperature=1.0, seed=0, method="auto")  # warm-up
for method in methods:
    name, _, opts = method.partition(":")
    options = dict(kv.split("=") for kv in opts.split(",")) if opts else None
    stat.clear()
    toks = secs = forwards = 0
    for i, p in enumerate(prompts):
        r = sm.generate(p, max_new_tokens=256, temperature=1.0, seed=i, method=name, method_options=options)
        toks += r.new_tokens
        secs += r.wall_time
        forwards += r.target_forwards
    parts = "  ".join(f"{k} {c} rounds {1000 * t / max(1, c):.2f} ms" for k, (c, t) in sorted(stat.items()))
    print(f"{method:32s} {toks / secs:6.1f} tok/s tokens {toks} tau {toks / max(1, forwards):.2f}  {parts}", flush=True)
