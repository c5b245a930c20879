"""Which clock is steadiest on this KVM guest (diagnostic): python logs/s70_noise.py U N.

The same burst (U users, ar and auto alternated) N times; per burst the wall time, the process's CPU time (both
threads; a guest's CPU time leaves out what the host stole when steal accounting is on) and the steal ticks of
/proc/stat over the burst. Prints each clock's spread (coefficient of variation) per method."""
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402


def steal() -> int:
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


users, n = int(sys.argv[1]), int(sys.argv[2])
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
for spec in ("ar", "auto"):
    run_ours(sm, prompts[: max(2, users // 4)], spec, 8, max_batch=users)
res = {"ar": [], "auto": []}
for i in range(n):
    for spec in (("ar", "auto") if i % 2 == 0 else ("auto", "ar")):
        s0, c0, w0 = steal(), time.process_time(), time.perf_counter()
        r = run_ours(sm, prompts, spec, 128, max_batch=users)
        w, c, s = time.perf_counter() - w0, time.process_time() - c0, (steal() - s0) / 100
        res[spec].append((w, c, s, sum(r["tokens"])))
        print(f"{spec:5s} wall {w:6.3f} s  cpu {c:6.3f} s  steal {s:5.2f} s  tokens {sum(r['tokens'])}", flush=True)
for spec, xs in res.items():
    for j, name in enumerate(("wall", "cpu", "wall-steal/2")):
        v = [x[0] - x[2] / 2 for x in xs] if j == 2 else [x[j] for x in xs]
        print(f"{spec:5s} {name:13s} mean {statistics.mean(v):.3f} cv {statistics.pstdev(v) / statistics.mean(v):.3f}")
for j, name in enumerate(("wall", "cpu")):
    r = [a[j] / b[j] for a, b in zip(res["auto"], res["ar"])]
    print(f"auto/ar time by {name}: {[round(x, 3) for x in r]} median {statistics.median(r):.3f}")
