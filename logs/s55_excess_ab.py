"""A/B in one process, interleaved: batched rows sizing trees with the measured batch excess (default) against the
curve alone (BatchDecoder.measure_excess = False, the rule until stop 55), and batched ar; bursts of U users."""
import statistics, sys, torch
torch.set_num_threads(2)
import drafttree
from drafttree.batching import decode as bd
from drafttree.bench.concurrency import interleaved_prompts, run_ours
from drafttree.bench.tasks import BUILTIN

users = [int(u) for u in (sys.argv[1] if len(sys.argv) > 1 else "16").split(",")]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), max(users))
run_ours(sm, prompts[:4], "auto", 8); run_ours(sm, prompts[:4], "ar", 8)
arms = [("auto", True), ("auto", False), ("ar", True)]
for u in users:
    got = {a: [] for a in arms}
    for rep in range(reps):
        for arm in (arms if rep % 2 == 0 else arms[::-1]):
            bd.BatchDecoder.measure_excess = arm[1]
            r = run_ours(sm, prompts[:u], arm[0], 128, max_batch=u)
            got[arm].append((sum(r["tokens"]) / r["wall"], r["tau"], r["tree"]))
    for arm, rs in got.items():
        med = sorted(rs)[len(rs) // 2]
        print(f"{u:3d} users {arm[0]:5s} excess={arm[1]!s:5s} median {med[0]:6.1f} tok/s tau {med[1]:.3f} "
              f"tree {med[2]:.2f}  runs {', '.join(f'{x[0]:.1f}' for x in rs)}", flush=True)
