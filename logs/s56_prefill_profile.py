"""Where a packed prefill of the six tasks' first 16 prompts spends its time (torch profiler by op and input shape;
stop 56: GEMMs 62%, flash attention 24%, silu and multiply 8%). Usage: python logs/s56_prefill_profile.py"""
import torch
from torch.profiler import ProfilerActivity, profile

import drafttree
from drafttree.batching.target import BatchTarget
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN

torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
ids = [sm.encode_prompt(p) for p in interleaved_prompts(list(BUILTIN), 16)]
print("prompt lengths", [x.numel() for x in ids], "total", sum(x.numel() for x in ids))
BatchTarget(sm.target.model).add_many(ids, [128] * 16)  # warm-up
bt = BatchTarget(sm.target.model)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    bt.add_many(ids, [128] * 16)
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=30,
                                                         max_name_column_width=40, max_shapes_column_width=80))
