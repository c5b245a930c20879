"""auto against ar in alternated bursts, round by round (diagnostic): python logs/s68_vs_ar.py U PAIRS.

Per burst: tok/s, tau; per method and row count: rounds, drafting rounds, ms per plain round and per drafting round,
and the Python pieces of a round (drafting, observe) that ar does not pay; then the paired ratios."""
import sys
import time
from collections import defaultdict

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.batching import decode as bd  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts, run_ours  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users, pairs = int(sys.argv[1]), int(sys.argv[2])
ROUNDS = []  # (rows, drafted, ms, forward ms)
FWD = {}
orig_step, orig_fwd = bd.BatchDecoder.step, bd.BatchTarget.forward_trees


def step(self):
    t0 = time.perf_counter()
    FWD["ms"] = 0.0
    out = orig_step(self)
    if self.rows or out:
        drafted = getattr(self.policy, "_last_choice", None)
        ROUNDS.append((len(out), drafted, 1000 * (time.perf_counter() - t0), FWD["ms"]))
    return out


def forward_trees(self, trees):
    t0 = time.perf_counter()
    out = orig_fwd(self, trees)
    FWD["ms"] = 1000 * (time.perf_counter() - t0)
    FWD["drafted"] = any(t.size > 1 for t in trees)
    return out


bd.BatchDecoder.step = step
bd.BatchTarget.forward_trees = forward_trees
orig_choose = bd.DraftWhilePays.choose


def choose(self, rows, kind=""):
    self._last_choice = orig_choose(self, rows, kind)
    return self._last_choice


bd.DraftWhilePays.choose = choose
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users)
for spec in ("ar", "auto"):  # warm both
    run_ours(sm, prompts[: max(2, users // 4)], spec, 8, max_batch=users)
rates = defaultdict(list)
TOTAL = defaultdict(lambda: [0, 0, 0.0])  # (spec, rows) -> [rounds, drafting rounds, ms]
for p in range(pairs):
    for spec in (("ar", "auto") if p % 2 == 0 else ("auto", "ar")):
        ROUNDS.clear()
        r = run_ours(sm, prompts, spec, 128, max_batch=users)
        rate = sum(r["tokens"]) / r["wall"]
        rates[spec].append(rate)
        for x in ROUNDS:
            t = TOTAL[spec, x[0]]
            t[0] += 1
            t[1] += bool(x[1]) and spec == "auto"
            t[2] += x[2]
        full = [x for x in ROUNDS if x[0] == users]
        plain = [x for x in full if not x[1]]
        draft = [x for x in full if x[1]]
        line = f"{spec:5s} {rate:6.1f} tok/s tau {r['tau']:.3f}; {len(ROUNDS)} rounds, {len(full)} at {users} rows:"
        if plain:
            line += (f" {len(plain)} plain {sum(x[2] for x in plain) / len(plain):.2f} ms "
                     f"(forward {sum(x[3] for x in plain) / len(plain):.2f})")
        if draft:
            line += (f", {len(draft)} drafting {sum(x[2] for x in draft) / len(draft):.2f} ms "
                     f"(forward {sum(x[3] for x in draft) / len(draft):.2f})")
        print(line, flush=True)
print("paired auto/ar:", [round(a / b, 3) for a, b in zip(rates["auto"], rates["ar"])])
print("rows: ar rounds, ms total | auto rounds (drafting), ms total | auto - ar ms (all runs)")
for rows in sorted({r for (_, r) in TOTAL}, reverse=True):
    a, b = TOTAL["ar", rows], TOTAL["auto", rows]
    print(f"{rows:>3}: {a[0]:>5} {a[2]:>9.0f} | {b[0]:>5} ({b[1]:>4}) {b[2]:>9.0f} | {b[2] - a[2]:>+8.0f}")
