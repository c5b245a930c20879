"""Stop 52 diagnostic (not the benchmark): a head round's modelled cost (target forwards, `spent`) against its
measured time over a one-token target forward, in auto alone at T=0 over the six tasks' first prompts."""
import time, statistics, torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
from drafttree.sources.model_sources import HeadSource
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), 6)
rows = []
orig = HeadSource.propose
def propose(self, rc, index):
    t = time.perf_counter(); p = orig(self, rc, index); dt = time.perf_counter() - t
    rows.append((dt, p.spent if p is not None else None, p.catch_up if p is not None else 0.0, self.cost)); return p
HeadSource.propose = propose
sm.generate(prompts[0], 16)
rows.clear()
# a one-token forward now (ar rounds)
r = sm.generate(prompts[0], 64, method="ar"); v1 = r.stats.time_verify / (r.stats.target_forwards - 1)
for p in prompts:
    sm.generate(p, 128)
r = sm.generate(prompts[0], 64, method="ar"); v1 = (v1 + r.stats.time_verify / (r.stats.target_forwards - 1)) / 2
print(f"one-token forward {v1*1e3:.2f} ms; head level cost (modelled) {rows[0][3]:.3f} forwards; {len(rows)} head rounds")
ok = [(dt, s, c) for dt, s, c, _ in rows if s is not None]
print("measured / v1:", f"{statistics.mean(dt for dt,_,_ in ok)/v1:.3f}", " modelled spent:", f"{statistics.mean(s for _,s,_ in ok):.3f}",
      " of which catch-up", f"{statistics.mean(c for _,_,c in ok):.3f}")
for dt, s, c in ok[:15]:
    print(f"  {dt*1e3:6.2f} ms = {dt/v1:.3f} fwd, modelled {s:.3f} (catch-up {c:.3f})")
