"""Stop 82 diagnostic: at T>0, does the target's own confidence at the last position (the probability of the root it
just sampled, and its distribution's top probability) predict whether `auto`'s next round accepts drafts? Rows per
bin of p(root): rounds, share that verified a tree, accepted drafts per round, drafting ms per round.
python logs/s82_root_signal.py TEMPERATURE N TASKFILE...  (logs/s82_root_signal.log)"""

import json
import sys
import time
from collections import defaultdict

import torch

import drafttree
from drafttree import decode as dec
from drafttree.drafters import hybrid

temp, n, tasks = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
sm = drafttree.load(dtype="bfloat16")
state = {"p": None, "top": None}
rows = []
real_accept, rp, ro = dec.accept, hybrid.HybridDrafter.propose, hybrid.HybridDrafter.observe


def accept(tree, logits, sampling, noise, root_pos):
    path, nxt = real_accept(tree, logits, sampling, noise, root_pos)
    probs = torch.softmax(logits[path[-1]].float() / max(1e-6, sampling.temperature), -1)
    state["p"], state["top"] = float(probs[nxt]), float(probs.max())
    return path, nxt


def propose(self, req):
    t = time.perf_counter()
    tree = rp(self, req)
    state["row"] = dict(p=state["p"], top=state["top"], size=tree.size, draft=time.perf_counter() - t)
    return tree


def observe(self, committed, features, next_root):
    r = state.pop("row", None)
    if r is not None and r["p"] is not None:
        r["acc"] = len(committed) - 1
        r["task"] = cur_task
        rows.append(r)
    return ro(self, committed, features, next_root)


dec.accept, hybrid.HybridDrafter.propose, hybrid.HybridDrafter.observe = accept, propose, observe
cur_task = ""
for task in tasks:
    cur_task = task.rsplit("/", 1)[-1].split(".")[0]
    with open(task) as f:
        prompts = [json.loads(x)["turns"][0] for x in f][:n]
    for i, p in enumerate(prompts):
        state["p"] = None
        sm.generate(p, 256, temperature=temp, seed=i)

EDGES = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1.01]


def table(sel, key):
    agg = defaultdict(lambda: [0, 0, 0, 0.0])
    for r in sel:
        b = max(i for i, e in enumerate(EDGES) if r[key] >= e)
        a = agg[b]
        a[0] += 1
        a[1] += r["size"] > 1
        a[2] += r["acc"]
        a[3] += r["draft"]
    for b in sorted(agg):
        a = agg[b]
        print(f"  {key} [{EDGES[b]:.2f},{EDGES[b + 1]:.2f})  rounds {a[0]:5d}  tree {a[1] / a[0]:.2f}"
              f"  accepted/round {a[2] / a[0]:.3f}  draft ms {1000 * a[3] / a[0]:.2f}")


for task in sorted({r["task"] for r in rows}) + ["ALL"]:
    sel = [r for r in rows if task in ("ALL", r["task"])]
    print(f"{task}: rounds {len(sel)}")
    table(sel, "p")
    table(sel, "top")
