"""Stop 83 diagnostic: at T>0, does a verified tree accept what its calibrated estimate promised? Per drafting round
of `auto` (alone): the tree's expected accepted drafts (the sum of its nodes' estimated acceptance, which the budget
sized the tree by) against the drafts accepted, binned by the estimate, and split by whether the head drafted. A
selection bias (trees are verified where estimates run high) would show as accepted < expected in the upper bins.
python logs/s83_t1_calibration.py TASKFILE N TEMPERATURE TOKENS"""

import json
import sys
from collections import defaultdict

import torch

import drafttree
from drafttree.drafters import hybrid

torch.set_num_threads(2)
task, n, temp, tokens = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
sm = drafttree.load(dtype="bfloat16")
with open(task) as f:
    prompts = [json.loads(x)["turns"][0] for x in f][:n]
rows, cur = [], {}
rp, ro = hybrid.HybridDrafter.propose, hybrid.HybridDrafter.observe


def propose(self, req):
    tree = rp(self, req)
    cur.clear()
    cur.update(size=tree.size, expected=float(getattr(tree, "expected_accept", 0.0) or 0.0),
               head="head" in (req.info.get("sources") or []))
    return tree


def observe(self, committed, features, next_root):
    cur["acc"] = len(committed) - 1
    if cur.get("size", 1) > 1:
        rows.append(dict(cur))
    return ro(self, committed, features, next_root)


hybrid.HybridDrafter.propose, hybrid.HybridDrafter.observe = propose, observe
for i, p in enumerate(prompts):
    sm.generate(p, max_new_tokens=tokens, temperature=temp, seed=i)
edges = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 99.0]
print(f"# {' '.join(sys.argv[1:])}: {len(rows)} tree rounds")
for name, sel in [("all", lambda r: True), ("head drafted", lambda r: r["head"]), ("no head", lambda r: not r["head"])]:
    by = defaultdict(list)
    for r in rows:
        if sel(r):
            b = max(i for i, e in enumerate(edges[:-1]) if r["expected"] >= e)
            by[b].append(r)
    print(name)
    for b in sorted(by):
        rs = by[b]
        ex = sum(r["expected"] for r in rs) / len(rs)
        ac = sum(r["acc"] for r in rs) / len(rs)
        sz = sum(r["size"] for r in rs) / len(rs)
        print(f"  expected [{edges[b]:.2f}, {edges[b + 1]:.2f}) rounds {len(rs):4d} size {sz:5.1f} "
              f"expected {ex:.3f} accepted {ac:.3f} ratio {ac / max(1e-9, ex):.2f}")
