"""Probe (stop 75): chains against trees on the real default model (SmolLM2-135M, bf16, 2 threads), a diagnostic of
what a model that verifies chains only (chain_target.py) gets from each method with real acceptance: the same model
run through ChainTarget (its own masks and DynamicCache, the first chain of each tree, rollback by snapshot) beside
the tree target. Alternated, R rounds, the first question of each of the six tasks, 128 new tokens, greedy; every
output checked equal to plain decoding's. python logs/s75_chain_real.py [rounds]"""
import statistics
import sys
import time

import torch

from drafttree.api import SpeculativeModel
from drafttree.bench.tasks import load_tasks
from drafttree.chain_target import ChainTarget

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
torch.set_num_threads(2)
sm = SpeculativeModel.from_pretrained(dtype="bfloat16", show_progress=False)
trees = sm._runner
chains = ChainTarget(sm.target.model, getattr(sm.head, "aux_layers", None))
prompts = [t.questions[0].turns[0] for t in load_tasks(["mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa"],
                                                        "../shared/data/bench", 1)]
CONFIGS = [("trees", "ar"), ("trees", "auto"), ("chains", "ar"), ("chains", "lookup"), ("chains", "auto"),
           ("chains", "eagle2")]


def run(kind, method, prompt):
    sm._runner = trees if kind == "trees" else chains
    t0 = time.perf_counter()
    out = sm.generate([{"role": "user", "content": prompt}], max_new_tokens=128, method=method)
    return time.perf_counter() - t0, out


for kind, method in CONFIGS:  # warm-up (and the chain target's verify curve, measured once)
    run(kind, method, "Hi.")
secs = {c: [] for c in CONFIGS}
toks = {c: 0 for c in CONFIGS}
taus = {c: [] for c in CONFIGS}
same: dict[tuple, int] = {}  # outputs equal to plain decoding's on the same target (bf16: kernels' rounding differs)
for r in range(ROUNDS):
    for p in prompts:
        outs = {}
        for c in (CONFIGS if r % 2 == 0 else CONFIGS[::-1]):
            s, out = run(*c, p)
            secs[c].append(s)
            toks[c] += out.new_tokens
            taus[c].append(out.tau)
            outs[c] = out.tokens
        for c in CONFIGS:  # the same text as plain decoding on the same target
            same[c] = same.get(c, 0) + (outs[c] == outs[(c[0], "ar")])
base = {k: toks[("trees" if k == "trees" else "chains", "ar")] / sum(secs[("trees" if k == "trees" else "chains",
                                                                            "ar")]) for k in ("trees", "chains")}
for c in CONFIGS:
    tps = toks[c] / sum(secs[c])
    print(f"{c[0]:6s} {c[1]:7s} {tps:6.1f} tok/s  tau {statistics.mean(taus[c]):.2f}  "
          f"{tps / base[c[0]]:.2f}x its own ar  {tps / base['trees']:.2f}x the tree target's ar  "
          f"{same[c]}/{ROUNDS * len(prompts)} identical to its own ar", flush=True)
