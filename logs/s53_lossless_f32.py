"""Stop 53 check (not the benchmark): auto:live_curve=true gives ar's tokens in float32 at T=0, and at T=1 with a seed
the same text twice (and ar's text with that seed: the output never depends on the trees, noise.py)."""
import torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
sm = drafttree.load(dtype="float32", show_progress=False)
prompts = interleaved_prompts(list(BUILTIN), 3)
live = dict(method="auto", method_options={"live_curve": True})
for p in prompts:
    ar = sm.generate(p, 96, method="ar").token_ids if hasattr(sm.generate(p, 1, method="ar"), "token_ids") else None
    a = sm.generate(p, 96, method="ar"); b = sm.generate(p, 96, **live)
    print("T=0 identical:", a.text == b.text, "tau", round(b.tau, 2))
    s1 = sm.generate(p, 64, temperature=1.0, seed=7, **live); s2 = sm.generate(p, 64, temperature=1.0, seed=7, **live)
    s0 = sm.generate(p, 64, temperature=1.0, seed=7, method="ar")
    print("T=1 seed 7: same twice", s1.text == s2.text, "same as ar", s1.text == s0.text)
