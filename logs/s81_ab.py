"""Stop 81 diagnostic: `ar` and `auto` alternated prompt by prompt in one process over N prompts of each task file:
auto / ar decode tokens/s (prefill excluded) and tau; run with PYTHONPATH=<code>/src, alternating code.
python logs/s81_ab.py TEMPERATURE N TASKFILE...   (logs/s81_ab.log)"""

import json
import sys

import torch

import drafttree

torch.set_num_threads(2)

sm = drafttree.load(dtype="bfloat16")
temp, n = float(sys.argv[1]), int(sys.argv[2])
prompts = []
for task in sys.argv[3:]:
    with open(task) as f:
        prompts += [json.loads(x)["turns"][0] for x in f][:n]
sm.generate(prompts[0], 16, temperature=temp, seed=0)
sm.generate(prompts[0], 16, temperature=temp, seed=0, method="ar")
tot = {"ar": [0.0, 0, 0], "auto": [0.0, 0, 0]}
for i, p in enumerate(prompts):
    for m in ("ar", "auto") if i % 2 == 0 else ("auto", "ar"):
        r = sm.generate(p, 256, temperature=temp, seed=i, method=m)
        t = tot[m]
        t[0] += r.wall_time - r.stats.time_prefill
        t[1] += r.new_tokens
        t[2] += r.target_forwards
code = drafttree.__file__.split("/src/")[0]
ra = tot["auto"][1] / tot["auto"][0] / (tot["ar"][1] / tot["ar"][0])
tau, ar = tot["auto"][1] / tot["auto"][2], tot["ar"][1] / tot["ar"][0]
print(f"{code}: auto/ar decode tok/s {ra:.3f}, tau {tau:.3f}, ar {ar:.1f} tok/s")
