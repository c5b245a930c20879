"""Where a packed prefill of U users' first prompts goes (stop 58, a diagnostic): tokens, time packed and one at a time, torch profiler. Usage: python logs/s58_prefill_profile.py 16"""
import sys, time, torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
sm = drafttree.load(dtype="bfloat16")
users = int(sys.argv[1]) if len(sys.argv) > 1 else 16
prompts = interleaved_prompts(list(BUILTIN), users)
ids = [sm.prompt_ids(p, True) for p in prompts]
print("prompt tokens", [x.numel() for x in ids], "total", sum(x.numel() for x in ids))
bt = sm.batch_target()
def once():
    t0 = time.perf_counter()
    bt.add_many(ids, [128] * len(ids))
    t = time.perf_counter() - t0
    bt.keep([])
    return t
once(); once()
print("packed prefill", min(once() for _ in range(3)))
def single():
    t0 = time.perf_counter()
    for x in ids:
        bt.add_many([x], [128]); bt.keep([])
    return time.perf_counter() - t0
print("one at a time", min(single() for _ in range(2)))
with torch.profiler.profile() as p:
    once()
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
