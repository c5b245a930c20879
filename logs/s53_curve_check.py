"""Stop 53 diagnostic (not the benchmark): does the cached verify-cost curve predict the verify forwards decoding
actually runs? Times every forward_tree call of `auto` and `ar` on a few prompts and prints measured / curve per size.
Usage: s53_curve_check.py [n_prompts] [max_new_tokens]"""
import sys, time, statistics, collections, torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
sm = drafttree.load(dtype="bfloat16")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
mnt = int(sys.argv[2]) if len(sys.argv) > 2 else 128
prompts = interleaved_prompts(list(BUILTIN), n)
curve = sm.verify_cost()
print("curve", curve.relative(), "1-token ms", round(curve.seconds[0] * 1e3, 2), "context", curve.context)
log = []
orig = sm._runner.forward_tree
def timed(tokens, depths, ancestors):
    t = time.perf_counter(); out = orig(tokens, depths, ancestors); log.append((tokens.numel(), sm._runner.length, time.perf_counter() - t)); return out
sm._runner.forward_tree = timed
sm.generate(prompts[0], 16, method="ar"); sm.generate(prompts[0], 16)
for m in ("ar", "auto", "ar", "auto"):
    log.clear()
    rs = [sm.generate(p, mnt, method=None if m == "auto" else m) for p in prompts]
    by = collections.defaultdict(list)
    for size, length, sec in log:
        by[min(size, 33) if size < 8 else (size // 4) * 4].append(sec / curve.at(length).verify(size))
    print(m, "tok/s", round(statistics.mean(r.tokens_per_second for r in rs), 1), "tau", round(statistics.mean(r.tau for r in rs), 2),
          {k: (len(v), round(statistics.median(v), 2)) for k, v in sorted(by.items())})
