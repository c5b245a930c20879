"""Stop 80 diagnostic: does a gap between target forwards make the next forward slower? `ar` on long prompts (T=1,
seeded) with nothing, a sleep or a busy Python loop of GAP ms before each forward (in the drafter's propose), the
three conditions rotated per prompt and repeat in one process; verify ms per target forward, median over repeats:
python logs/s80_gap_probe.py data/heldout/long_doc.jsonl 3 4 1.5"""
import json
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402

path, n, repeats, gap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]) / 1000
with open(path) as f:
    prompts = [json.loads(x)["turns"][0] for x in f][:n]
sm = drafttree.load(dtype="bfloat16")
drafter_cls = type(sm.drafter("ar", None))
real = drafter_cls.propose
mode = ["none"]


def propose(self, req):
    if mode[0] == "sleep":
        time.sleep(gap)
    elif mode[0] == "busy":
        t = time.perf_counter()
        while time.perf_counter() - t < gap:
            pass
    return real(self, req)


drafter_cls.propose = propose
sm.generate(prompts[0], 16, method="ar")
got = {"none": [], "sleep": [], "busy": []}
conditions = list(got)
for rep in range(repeats):
    for i, p in enumerate(prompts):
        for c in conditions[(rep + i) % 3:] + conditions[: (rep + i) % 3]:
            mode[0] = c
            r = sm.generate(p, 192, temperature=1.0, seed=i, method="ar")
            got[c].append(1000 * r.stats.time_verify / r.target_forwards)
for c, v in got.items():
    print(f"{c:5s} gap {1000 * gap if c != 'none' else 0:.1f} ms: verify {statistics.median(v):.2f} ms/forward "
          f"(median of {len(v)}; min {min(v):.2f}, max {max(v):.2f})")
