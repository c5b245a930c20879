"""Diagnostic: a prompt's prefill from nothing against its rest after a shared prefix (TargetModel(keep_prefix=True)
running only the tokens after the common prefix, on the tree path), the two alternated, the fastest of 7 each, bf16.
Pairs: two CNN/DM articles (28 tokens in common: the chat template's system prompt), and short prompts.
Usage: python logs/s61_rest_vs_fresh.py   (run before the share rule in TargetModel._reusable; with the rule the
long pair's reuse falls back to a fresh prefill)"""
import time

import torch

import drafttree
from drafttree.bench.tasks import load_tasks
from drafttree.target import TargetModel, common_prefix

torch.set_num_threads(2)
lm = drafttree.load_model("smollm2-135m-instruct", dtype="bfloat16", show_progress=False)
sm = drafttree.SpeculativeModel(lm, method="ar")
art = load_tasks(["sum"])[0].questions
pairs = [(art[0].turns[0], art[1].turns[0]),
         ("Name a fruit.", "Write a limerick about a cat who lives on a boat and loves the sea."),
         ("Name a fruit.", "Explain, in a few careful paragraphs, " + "why the sky looks blue at noon and red at "
          "sunset; " * 6)]
TargetModel.REST_ANYWAY, TargetModel.REUSE_SHARE = 10**9, 0.0  # always reuse: what the rule was decided on
for qa, qb in pairs:
    a = sm.encode_prompt([{"role": "user", "content": qa}])
    b = sm.encode_prompt([{"role": "user", "content": qb}])
    fresh, cached = TargetModel(lm.model), TargetModel(lm.model, keep_prefix=True)
    for x in (a, b):
        fresh.prefill(x)
        cached.prefill(x)
    res = {"fresh": [], "rest": []}
    for _ in range(7):
        for name, tm in (("fresh", fresh), ("rest", cached)):
            tm.prefill(a)
            t = time.perf_counter()
            tm.prefill(b)
            res[name].append(time.perf_counter() - t)
    print(f"{b.numel()} tokens, {common_prefix(a.tolist(), b.tolist())} in common: fresh "
          f"{1000 * min(res['fresh']):.1f} ms, rest {1000 * min(res['rest']):.1f} ms "
          f"({min(res['rest']) / min(res['fresh']):.2f}x)")
