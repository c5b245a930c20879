"""Stop 81 diagnostic: per source at T=1, the verified nodes it proposed (in the kept tree) and how many were accepted,
with tau, on N prompts of each task file; run with PYTHONPATH=<code>/src to compare code.
python logs/s81_source_efficiency.py N TASKFILE...   (logs/s81_source_efficiency.log)"""

import json
import sys

import torch

import drafttree
from drafttree.drafters import hybrid

torch.set_num_threads(2)

sm = drafttree.load(dtype="bfloat16")
prompts = []
for task in sys.argv[2:]:
    with open(task) as f:
        prompts += [json.loads(x)["turns"][0] for x in f][: int(sys.argv[1])]
stats = {}
real = hybrid.HybridDrafter._learn


def learn(self, committed):
    merged, keep, ran = self._round
    path = [0]
    for tok in committed[1:]:
        path.append(merged.child[(path[-1], tok)])
    on = set(path)
    for node in keep[1:]:
        for src in {s for s, _ in merged.owners[node]}:
            st = stats.setdefault(self.sources[src].name, [0, 0])
            st[0] += 1
            st[1] += node in on
    return real(self, committed)


hybrid.HybridDrafter._learn = learn
sm.generate(prompts[0], 16, temperature=1.0, seed=0)
stats.clear()
tok = fw = 0
for i, p in enumerate(prompts):
    r = sm.generate(p, 256, temperature=1.0, seed=i)
    tok += r.new_tokens
    fw += r.target_forwards
code = drafttree.__file__.split("/src/")[0]
print(
    code,
    f"tau {tok / fw:.3f} forwards {fw}",
    {k: (v[0], v[1], round(v[1] / max(1, v[0]), 3)) for k, v in stats.items()},
)
