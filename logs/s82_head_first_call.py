"""Stop 82 diagnostic: the EAGLE head's first call of a generation (its catch-up over the whole prompt) against its
later calls, S, held-out long documents, T=1. python logs/s82_head_first_call.py (logs/s82_head_first_call.log)"""

import json, time
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
    print(
        r.prompt_tokens,
        "prefill %.3f" % st.time_prefill,
        "first head call ctx %d %.3f s" % calls[0] if calls else None,
        "later mean %.4f n %d" % (sum(c for _, c in calls[1:]) / max(1, len(calls) - 1), len(calls)),
        "wall %.2f" % st.wall_time,
    )
