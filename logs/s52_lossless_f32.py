"""Stop 52 check (not the benchmark): at T=0 in float32 the opt-in options of this stop give plain decoding's tokens on
the default model with the shipped head (three prompts x 96 tokens)."""
import torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
sm = drafttree.load(dtype="float32")
prompts = interleaved_prompts(list(BUILTIN), 3)
for p in prompts:
    ref = sm.generate(p, 96, method="ar").tokens
    for opts in ({}, {"greedy_gate": True}, {"clock_cost": True}, {"greedy_gate": True, "clock_cost": True}):
        out = sm.generate(p, 96, method_options=opts or None).tokens
        print(opts, "identical" if out == ref else f"DIFFERENT at {next(i for i,(a,b) in enumerate(zip(out,ref)) if a!=b)}")
