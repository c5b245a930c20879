"""A burst's rounds by row count (stop 73, a diagnostic): per bucket of rows, rounds, seconds, tokens committed, for
each method. Usage: python logs/s73_round_rows.py USERS METHOD..."""
import sys
import time
from collections import defaultdict

import torch

import drafttree
from drafttree.batching.decode import BatchDecoder
from drafttree.bench.concurrency import interleaved_prompts, run_ours
from drafttree.bench.tasks import BUILTIN

torch.set_num_threads(2)
users, methods = int(sys.argv[1]), sys.argv[2:]
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
step = BatchDecoder.step
log = []


def timed_step(self):
    n = len([s for s in self.active if not s.finished])
    t0 = time.perf_counter()
    out = step(self)
    log.append((n, time.perf_counter() - t0, sum(len(new) for _, new in out)))
    return out


BatchDecoder.step = timed_step
print(f"# python logs/s73_round_rows.py {' '.join(sys.argv[1:])}")
for m in methods:
    run_ours(sm, prompts, m, 128)
for m in methods * 2:
    log.clear()
    r = run_ours(sm, prompts, m, 128)
    b = defaultdict(lambda: [0, 0.0, 0])
    for n, t, k in log:
        key = 16 if n >= 16 else (8 if n >= 8 else (4 if n >= 4 else n))
        key = n if users <= 4 else key
        b[key][0] += 1
        b[key][1] += t
        b[key][2] += k
    print(m, f"wall {r['wall']:.3f}", "  ".join(f"rows>={k}: {v[0]} rounds {v[1]:.3f} s {v[2]} tok "
                                                f"({v[2] / v[1]:.0f}/s)" for k, v in sorted(b.items(), reverse=True)))
