"""Stop 81 diagnostic: `auto`'s rounds by kind (gated / drafted but verified the root alone / verified a tree):
drafting, verify (against the live curve's one-token forward) and observe ms, accepted drafts, ms per token, and each
source's drafting ms per round; then the gates' state. python logs/s81_t1_round_kinds.py TASKFILE N TEMPERATURE
(logs/s81_t1_round_kinds.log: data/heldout/long_doc.jsonl 4 1.0)"""

import gc
import json
import sys
import time
from collections import defaultdict

import torch

import drafttree
from drafttree.drafters import hybrid
from drafttree.sources import corpus, model_sources, ngram

sm = drafttree.load(dtype="bfloat16")
task, n, temp = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with open(task) as f:
    prompts = [json.loads(x)["turns"][0] for x in f][:n]
cur = {}
rows = []
rp, rv, ro = hybrid.HybridDrafter.propose, hybrid.HybridDrafter.verified, hybrid.HybridDrafter.observe


def propose(self, req):
    src_t.clear()
    t = time.perf_counter()
    tree = rp(self, req)
    dt = time.perf_counter() - t
    cur.clear()
    cur.update(
        kind="gated" if req.info.get("gated") else ("root" if tree.size == 1 else "tree"),
        size=tree.size,
        draft=dt,
        **{k: v for k, v in src_t.items()},
        v1=self.base_cost.at(len(req.context)).verify(1),
    )
    return tree


def verified(self, tokens, context, seconds):
    cur["sec"] = seconds
    return rv(self, tokens, context, seconds)


def observe(self, committed, features, next_root):
    t = time.perf_counter()
    out = ro(self, committed, features, next_root)
    cur["obs"] = time.perf_counter() - t
    cur["acc"] = len(committed) - 1
    rows.append(dict(cur))
    return out


hybrid.HybridDrafter.propose, hybrid.HybridDrafter.verified, hybrid.HybridDrafter.observe = propose, verified, observe
src_t = {}


def wrapsrc(cls, label):
    real = cls.propose

    def f(self, rc, index):
        t = time.perf_counter()
        out = real(self, rc, index)
        src_t[label] = src_t.get(label, 0.0) + time.perf_counter() - t
        return out

    cls.propose = f


wrapsrc(model_sources.HeadSource, "head")
wrapsrc(ngram.NgramSource, "ngram")
wrapsrc(corpus.CorpusSource, "corpus")
sm.generate(prompts[0], 16, temperature=temp, seed=0)
rows.clear()
for i, p in enumerate(prompts):
    sm.generate(p, 256, temperature=temp, seed=i)
agg = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0, 0.0])
srcagg = defaultdict(float)
heads = defaultdict(int)
for r in rows:
    for k in ("head", "ngram", "corpus"):
        srcagg[(r["kind"], k)] += r.get(k, 0.0)
    heads[r["kind"]] += "head" in r
for r in rows:
    a = agg[r["kind"]]
    a[0] += 1
    a[1] += r["draft"]
    a[2] += r.get("sec", 0)
    a[3] += r["obs"]
    a[4] += r["acc"]
    a[5] += r["v1"]
tot_t = sum(a[1] + a[2] + a[3] for a in agg.values())
tot_tok = sum(a[0] + a[4] for a in agg.values())
print(f"rounds {len(rows)} tokens {tot_tok} tau {tot_tok / len(rows):.3f}")
for k, a in agg.items():
    n = a[0]
    print(
        f"{k:6s} rounds {n:5d} draft {1000 * a[1] / n:6.2f} verify {1000 * a[2] / n:6.2f} (v1 {1000 * a[5] / n:5.2f})"
        f" observe {1000 * a[3] / n:5.2f} accepted/round {a[4] / n:.3f}"
        f"  ms/token {1000 * (a[1] + a[2] + a[3]) / (n + a[4]):6.2f}"
    )
    print(
        "   per round ms:",
        {s: round(1000 * srcagg[(k, s)] / n, 3) for s in ("head", "ngram", "corpus")},
        "head calls",
        heads[k],
    )

torch.set_num_threads(2)

for o in gc.get_objects():
    if isinstance(o, hybrid.HybridDrafter):
        g = o.draft_gate
        print(
            "draft gate",
            {k: (round(g.gain[k], 3), round(g.cost[k], 3), round(g.base[k], 3)) for k in g.gain},
            g.enabled,
        )
        print(
            "source gates",
            [
                (s.name, {k: (round(x.gain[k], 3), round(x.cost[k], 3), round(x.base[k], 3)) for k in x.gain})
                for s, x in zip(o.sources, o.gates)
            ],
        )
        print(
            "sampled gates",
            [
                (s.name, {k: (round(x.gain[k], 3), round(x.cost[k], 3), round(x.base[k], 3)) for k in x.gain})
                for s, x in zip(o.sources, o._gate_sets["sampled"][0])
            ],
        )
