"""Side by side, interleaved in one process: the rotary kernel for every input (the rule before, ROTARY_KERNEL_MAX_TOKENS
huge) vs for up to 12 tokens (torch's ops above). Times: one long prompt's prefill (a CNN/DM question, as a user's time
to first token), and a 16-user burst of `auto` (drafttree bench concurrency's prompts, 128 tokens). bf16, 2 threads."""
import statistics
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN, load_tasks  # noqa: E402
from drafttree.kernels import layers  # noqa: E402

sm = drafttree.load(dtype="bfloat16")
long_prompt = load_tasks(["sum"])[0].questions[0].turns[0]
ids = sm.encode_prompt(long_prompt)
prompts = interleaved_prompts(list(BUILTIN), 16)
run_ours(sm, prompts[:4], "auto", 16)
RULES = {"kernel always (before)": 10**9, "kernel up to 12 tokens (after)": 12}
ttft, burst = {k: [] for k in RULES}, {k: [] for k in RULES}
for rep in range(3):
    for name in (list(RULES) if rep % 2 == 0 else list(RULES)[::-1]):
        layers.ROTARY_KERNEL_MAX_TOKENS = RULES[name]
        for _ in range(3):
            t0 = time.perf_counter()
            sm.generate(ids, max_new_tokens=1, method="ar")
            ttft[name].append(time.perf_counter() - t0)
        r = run_ours(sm, prompts, "auto", 128)
        burst[name].append(sum(r["tokens"]) / r["wall"])
print(f"long prompt: {ids.numel()} tokens")
for name in RULES:
    print(f"{name:32s} prefill+1 token {1000 * statistics.median(ttft[name]):7.1f} ms (median of 9)   "
          f"16-user burst {statistics.median(burst[name]):6.1f} tok/s (runs {', '.join(f'{b:.1f}' for b in burst[name])})")
