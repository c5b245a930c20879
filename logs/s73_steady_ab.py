"""auto against batched ar under a steady load, alternated in one process (stop 73, a diagnostic):
python logs/s73_steady_ab.py U R PAIRS [A B]

U users x R requests in turn each (the concurrency benchmark's steady load); methods A and B (default auto, ar)
alternated, the order swapped every pair; per run the aggregate tokens/s, the policy's drafting and plain rounds, and
the seconds in prefill and in rounds; the ratio of each pair."""
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching.decode import BatchDecoder  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users, per, pairs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
a, b = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else ("auto", "ar")
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users * per)
clock = {"prefill": 0.0, "rounds": 0.0}
add_many, step = BatchDecoder.add_many, BatchDecoder.step


def timed(fn, key):
    def wrapper(*x, **k):
        t0 = time.perf_counter()
        try:
            return fn(*x, **k)
        finally:
            clock[key] += time.perf_counter() - t0
    return wrapper


BatchDecoder.add_many, BatchDecoder.step = timed(add_many, "prefill"), timed(step, "rounds")
for m in (a, b):
    run_ours(sm, prompts[:users], m, 32, max_batch=users)  # warm-up
tps = {a: [], b: []}
print(f"# python logs/s73_steady_ab.py {' '.join(sys.argv[1:])}")
for r in range(pairs):
    for m in ((a, b) if r % 2 == 0 else (b, a)):
        clock.update(prefill=0.0, rounds=0.0)
        before = dict(sm.batch_policy._rounds) if hasattr(sm.batch_policy, "_rounds") else {}
        res = run_ours(sm, prompts, m, 128, max_batch=users)
        after = dict(getattr(sm.batch_policy, "_rounds", {}))
        tps[m].append(sum(res["tokens"]) / res["wall"])
        print(f"{m:24s} {tps[m][-1]:6.1f} tok/s  wall {res['wall']:.2f} s  prefill {clock['prefill']:.2f} s  rounds "
              f"{clock['rounds']:.2f} s  policy {({k: after.get(k, 0) - before.get(k, 0) for k in after})}", flush=True)
x = [p / q for p, q in zip(tps[a], tps[b])]
print(f"{a} / {b}, each pair: {', '.join(f'{v:.3f}' for v in x)}; mean {statistics.mean(x):.3f} "
      f"+- {statistics.stdev(x) / len(x) ** 0.5 if len(x) > 1 else 0:.3f}, median {statistics.median(x):.3f}")
