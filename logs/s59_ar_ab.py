"""Diagnostic (stop 59): plain decoding tokens/s of one prompt, best of 3 x 128 tokens; run from a checkout (PYTHONPATH=<checkout>/src) to compare two commits, alternating processes. Usage: python logs/s59_ar_ab.py LABEL"""
import sys, time, torch
torch.set_num_threads(2)
import drafttree
sm = drafttree.load(dtype="bfloat16")
p = "Write a short story about a lighthouse keeper who finds a message in a bottle."
sm.generate(p, max_new_tokens=16, method="ar")
best = 1e9
for _ in range(3):
    t = time.perf_counter(); r = sm.generate(p, max_new_tokens=128, method="ar", ignore_eos=True); best = min(best, time.perf_counter() - t)
print(sys.argv[1], f"{128/best:.1f} tok/s")
