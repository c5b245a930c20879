"""Diagnostic (not the benchmark): the draft LM's per-level decisions inside auto at L."""
import sys, math, collections
import torch
torch.set_num_threads(2)
from drafttree.api import SpeculativeModel
from drafttree.models import load_model
from drafttree.bench.tasks import load_task
from drafttree.sources import model_sources as ms
from drafttree import budget as bd

qid = int(sys.argv[1]); max_new = int(sys.argv[2])
target = load_model("qwen2.5-coder-1.5b-instruct", dtype="bfloat16")
draft = load_model("qwen2.5-coder-0.5b-instruct", dtype=target.dtype)
lm = SpeculativeModel(target, method="ar", draft=draft, head=None)
q = {q.question_id: q for q in load_task("humaneval").questions}[qid]
ids = lm.encode_prompt([{"role": "user", "content": q.turns[0]}])
log = []
orig = ms.ExpandingSource._pruner
def pruner(self, others, cells, offset=0.0, depth_offset=0):
    d = orig(self, others, cells, offset, depth_offset)
    def deeper(scores, frontier):
        sc = scores.cpu() + offset
        best = torch.sort(torch.cat([sc, others.cpu()]), descending=True).values.tolist()
        n, e, t = bd.best_tree(best, d.spent[0], self._verify_cost, self.max_total - 1, rule=self.prune_against)
        front = sc[frontier.cpu()]
        r = d(scores, frontier)
        log.append(dict(lv=len(cells) + depth_offset, n_others=len(others), n=n, e=round(e, 2), t=round(t, 2),
                        front=[round(math.exp(x), 2) for x in front[:3].tolist()], rate=round(self.level_rate(len(cells) + 1 + depth_offset), 2),
                        w=r, cost=round(self.cost, 3), v=[round(self._verify_cost(k), 3) for k in (1, 2, 4, 8)]))
        return r
    deeper.spent = d.spent
    return deeper
ms.ExpandingSource._pruner = pruner
from drafttree.drafters import hybrid as hy
rounds = []
_op = hy.HybridDrafter._propose
def _propose(self, req):
    from drafttree.drafters.hybrid import situation
    t = _op(self, req)
    m = self._round[0] if self._round else None
    ng = [s for s in (m.scores[1:] if m else [])]
    rounds.append(dict(info=dict(req.info), ran=[r[:2] for r in (self._round[2] if self._round else [])], nlog=len(log)))
    return t
hy.HybridDrafter._propose = _propose
_ob = hy.HybridDrafter.observe
def observe(self, committed, f, nr):
    if rounds: rounds[-1]['acc'] = len(committed) - 1
    return _ob(self, committed, f, nr)
hy.HybridDrafter.observe = observe
for rep in range(2):
    log.clear(); rounds.clear()
    res = lm.generate(ids, max_new_tokens=max_new, temperature=0.0, seed=0, method="auto")
    st = res.stats
    print(f"rep {rep}: tok/s {st.tokens_per_second:.2f} tau {st.tau:.2f} rounds {st.target_forwards}")
    d = lm.drafter("auto")
    for s_ in d.sources:
        c = s_.calibration
        print("  ", s_.name, "level hits", [round(x, 1) for x in c.level_hits], "tests", [round(x, 1) for x in c.level_tests], "extended", getattr(s_, "extended", None))
for r in rounds: print(r)
for e in log[:80]:
    print(e)
print(collections.Counter((e["lv"], e["w"]) for e in log))
d = lm.drafter("auto")
print("gates", [(g.gain, g.cost, g.base, g.wait) for g in d.gates])
