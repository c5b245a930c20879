"""Prefill of random prompts of 769 / 2,629 / 6,000 tokens (bf16, 2 threads) with torch's profiler: the time in attention and in products (stop 58, a diagnostic). Usage: python logs/s58_prefill_lengths.py"""
import time, torch
torch.set_num_threads(2)
import drafttree
sm = drafttree.load(dtype="bfloat16", show_progress=False)
runner = sm._runner
for n in (769, 2629, 6000):
    ids = torch.randint(100, 40000, (n,))
    runner.prefill(ids); 
    with torch.profiler.profile() as p:
        t0 = time.perf_counter(); runner.prefill(ids); t = time.perf_counter() - t0
    ev = {e.key: e.self_cpu_time_total for e in p.key_averages()}
    att = sum(v for k, v in ev.items() if "attention" in k or "sdpa" in k) / 1e6
    mm = ev.get("aten::mm", 0) / 1e6
    print(f"{n} tokens: prefill {t:.3f} s, attention {att:.3f} s, mm {mm:.3f} s", flush=True)
