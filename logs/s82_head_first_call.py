"""Stop 82 diagnostic: the EAGLE head's first call of a generation (its catch-up over the whole prompt) against its
later calls, S, held-out long documents, T=1. python logs/s82_head_first_call.py (logs/s82_head_first_call.log)"""

import json
import time

import drafttree
from drafttree.sources import model_sources

sm = drafttree.load(dtype="bfloat16")
with open("data/heldout/long_doc.jsonl") as f:
    prompts = [json.loads(x)["turns"][0] for x in f][:4]
calls = []
real = model_sources.HeadSource.propose


def prop(self, rc, i):
    t = time.perf_counter()
    out = real(self, rc, i)
    calls.append((len(rc.context), time.perf_counter() - t))
    return out


model_sources.HeadSource.propose = prop
sm.generate(prompts[0], 16, temperature=1.0, seed=0)
for i, p in enumerate(prompts):
    calls.clear()
    r = sm.generate(p, 256, temperature=1.0, seed=i)
    st = r.stats
    later = sum(c for _, c in calls[1:]) / max(1, len(calls) - 1)
    print(
        r.prompt_tokens,
        f"prefill {st.time_prefill:.3f}",
        f"first head call ctx {calls[0][0]} {calls[0][1]:.3f} s" if calls else None,
        f"later mean {later:.4f} n {len(calls)}",
        f"wall {st.wall_time:.2f}",
    )
