"""Diagnostic (not the benchmark): are nodes proposed by two sources accepted more often than either source's estimate?"""
import sys, json, collections, math
import torch
torch.set_num_threads(2)
from drafttree import load
from drafttree.drafters import hybrid as hy

recs = []
_learn = hy.HybridDrafter._learn
def learn(self, committed):
    merged, keep, ran = self._round
    path = [0]
    for tok in committed[1:]:
        path.append(merged.child[(path[-1], tok)])
    on = set(path)
    for node in keep[1:]:
        if merged.parents[node] in on:
            own = merged.owners[node]
            rates = {self.sources[s].name: self.sources[s].calibration.rate_of(c) for s, c in own}
            est = max(rates.values()) if rates else None
            if rates and merged.agreed[node] >= 0:  # what the tree used: the agreement's rate
                est = self.agreement.rate(merged.agreed[node], math.exp(merged.cond[node]))
            recs.append((tuple(sorted(rates)), est, node in on))
    return _learn(self, committed)
hy.HybridDrafter._learn = learn
files = sys.argv[1:]
lm = load(dtype="bfloat16")
opts = dict(agree=False) if "--off" in files else {}
files = [f for f in files if f != "--off"]
for f in files:
    for line in open(f):
        q = json.loads(line)
        lm.generate([{"role": "user", "content": q["turns"][0]}], max_new_tokens=128, temperature=0.0, method="auto", method_options=dict(opts))
agg = collections.defaultdict(lambda: [0, 0.0, 0])
for owners, r, hit in recs:
    if r is None: continue
    b = min(9, int(r * 10))
    k = ("+".join(owners), b)
    agg[k][0] += 1; agg[k][1] += r; agg[k][2] += hit
for k in sorted(agg):
    n, s, h = agg[k]
    if n >= 20: print(k, n, "est %.2f hit %.2f" % (s / n, h / n))
