"""Stop 81 diagnostic: with the noise-split cells (auto:noise_cells=true since 6577214), the sampled calibrations'
counts per noise bin after N prompts of each task file at T=1, against the split prior's rates for the same trials.
python logs/s81_noise_bins.py N TASKFILE...   (logs/s81_noise_bins.log)"""

import gc
import json
import sys

import torch

import drafttree
from drafttree.drafters import hybrid
from drafttree.sources.base import NOISE_BINS

torch.set_num_threads(2)

sm = drafttree.load(dtype="bfloat16")
prompts = []
for task in sys.argv[2:]:
    with open(task) as f:
        prompts += [json.loads(x)["turns"][0] for x in f][: int(sys.argv[1])]
for i, p in enumerate(prompts):
    sm.generate(p, 256, temperature=1.0, seed=i, method="auto", method_options={"noise_cells": True})
for o in gc.get_objects():
    if isinstance(o, hybrid.HybridDrafter):
        for s, cal in zip(o.sources, o.calibrations["sampled"]):
            if getattr(cal, "base_cells", None):
                h = cal.hits.reshape(-1, NOISE_BINS).sum(0)
                t = cal.trials.reshape(-1, NOISE_BINS).sum(0)
                pr = (cal.prior.reshape(-1, NOISE_BINS) * cal.trials.reshape(-1, NOISE_BINS)).sum(0)
                print(
                    s.name,
                    "trials",
                    [round(x, 1) for x in t.tolist()],
                    "rate",
                    [round(a / max(b, 1e-9), 3) for a, b in zip(h.tolist(), t.tolist())],
                    "prior-predicted",
                    [round(a / max(b, 1e-9), 3) for a, b in zip(pr.tolist(), t.tolist())],
                )
        print("source accepts", o.source_accepts)
