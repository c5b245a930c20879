"""Diagnostic: a prompt's rest after a prefix another prefill left (the chat template's system prompt), against a fresh
prefill of it: are the logits and features bitwise equal (bf16)? Usage: python logs/s61_rest_bits.py"""
import torch

import drafttree
from drafttree.bench.tasks import load_tasks
from drafttree.target import TargetModel

torch.set_num_threads(2)
TargetModel.REST_ANYWAY, TargetModel.REUSE_SHARE = 10**9, 0.0
lm = drafttree.load_model("smollm2-135m-instruct", dtype="bfloat16", show_progress=False)
sm = drafttree.SpeculativeModel(lm, method="ar")
art = load_tasks(["sum"])[0].questions
for qa, qb in [(art[0].turns[0], art[1].turns[0]), ("Name a fruit.", "Write a limerick about a cat on a boat.")]:
    a = sm.encode_prompt([{"role": "user", "content": qa}]); b = sm.encode_prompt([{"role": "user", "content": qb}])
    fresh, cached = TargetModel(lm.model), TargetModel(lm.model, keep_prefix=True)
    cached.prefill(a)
    x, y = fresh.prefill(b), cached.prefill(b)
    print(b.numel(), cached.reused, "logits equal:", torch.equal(x.logits, y.logits), "max diff", (x.logits.float()-y.logits.float()).abs().max().item(), "features equal:", torch.equal(x.features, y.features))
