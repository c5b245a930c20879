"""Stop 80 diagnostic: `auto`'s rounds on long prompts at T=1, by tree size: rounds, the drafter's expected accepted
drafts (tree.expected_accept x the budget's calibration) against those accepted, and the verify forward's measured
milliseconds against the live curve's prediction (and its one-token cost); then `ar`, `auto`, `ar` on the same prompts
(verify and drafting ms per target forward; `auto`'s root-only rounds' verify alone):
python logs/s80_t1_rounds.py data/heldout/long_doc.jsonl 4 1.0"""
import json
import sys
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.drafters import hybrid  # noqa: E402

sm = drafttree.load(dtype="bfloat16")
with open(sys.argv[1]) as f:
    prompts = [json.loads(x)["turns"][0] for x in f][: int(sys.argv[2])]
temp = float(sys.argv[3])
rounds, cur = [], {}
real_propose, real_verified, real_observe = (hybrid.HybridDrafter.propose, hybrid.HybridDrafter.verified,
                                             hybrid.HybridDrafter.observe)


def propose(self, req):
    tree = real_propose(self, req)
    curve = self.base_cost.at(len(req.context))
    cur.clear()
    cur.update(size=tree.size, exp=(tree.expected_accept or 0.0) * self.budget.calibration,
               pred=curve.verify(tree.size), pred1=curve.verify(1))
    return tree


def verified(self, tokens, context, seconds):
    cur["sec"] = seconds
    return real_verified(self, tokens, context, seconds)


def observe(self, committed, features, next_root):
    cur["acc"] = len(committed) - 1
    rounds.append(dict(cur))
    return real_observe(self, committed, features, next_root)


hybrid.HybridDrafter.propose, hybrid.HybridDrafter.verified, hybrid.HybridDrafter.observe = propose, verified, observe
sm.generate(prompts[0], 16, temperature=temp, seed=0)  # warm-up
rounds.clear()
for i, p in enumerate(prompts):
    sm.generate(p, 256, temperature=temp, seed=i)
by = defaultdict(lambda: [0] * 6)
for r in rounds:
    b = by[min(r["size"], 9)]
    for j, v in enumerate((1, r["exp"], r["acc"], r.get("sec", 0.0), r["pred"], r["pred1"])):
        b[j] += v
print("size  rounds  expected  accepted  verify ms: measured  predicted  one token")
for s in sorted(by):
    n, e, a, sec, pr, p1 = by[s]
    print(f"{s:4d} {n:7d} {e / n:9.3f} {a / n:9.3f} {1000 * sec / n:19.2f} {1000 * pr / n:10.2f} {1000 * p1 / n:10.2f}")
for m in ("ar", "auto", "ar"):
    rounds.clear()
    forwards = verify = draft = 0.0
    for i, p in enumerate(prompts):
        r = sm.generate(p, 256, temperature=temp, seed=i, method=m)
        forwards, verify, draft = forwards + r.target_forwards, verify + r.stats.time_verify, draft + r.stats.time_draft
    root = [x.get("sec", 0.0) for x in rounds if x["size"] == 1]
    extra = f", root-only rounds {len(root)}: verify {1000 * sum(root) / len(root):.2f} ms" if root else ""
    print(f"{m}: verify {1000 * verify / forwards:.2f} ms/forward, drafting {1000 * draft / forwards:.2f}{extra}")
