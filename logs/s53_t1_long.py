"""Stop 53 diagnostic (not the benchmark): auto at T=1 on long-context prompts (the longest training prompts, not a
benchmark task). Per round: the tree's expected accepted drafts (its calibrated estimate) against those accepted, and
each verify forward's measured time against the cached curve. Usage: s53_t1_long.py [n] [max_new_tokens] [temp]"""
import sys, json, time, statistics, collections, torch
torch.set_num_threads(2)
import drafttree
n = int(sys.argv[1]) if len(sys.argv) > 1 else 6
mnt = int(sys.argv[2]) if len(sys.argv) > 2 else 128
temp = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
rows = [json.loads(l) for l in open("/tmp/hp/prompts-train.jsonl")]
rows.sort(key=lambda r: -len(r["messages"][0]["content"]))
prompts = [r["messages"] for r in rows[:n]]
sm = drafttree.load(dtype="bfloat16", show_progress=False)
curve = sm.verify_cost()
print("curve", curve.relative(), "1-token ms", round(curve.seconds[0] * 1e3, 2), "per_key", curve.per_key)
log = []
orig = sm._runner.forward_tree
def timed(tokens, depths, ancestors):
    t = time.perf_counter(); out = orig(tokens, depths, ancestors)
    log.append((tokens.numel(), sm._runner.length, time.perf_counter() - t)); return out
sm._runner.forward_tree = timed
sm.generate(prompts[0], 8, method="ar"); sm.generate(prompts[0], 8)
for rep in range(2):
    for m in ("ar", "auto"):
        log.clear(); exp_acc = []
        d = sm.drafter(None, None) if m == "auto" else None
        if d is not None:
            op = type(d).propose
            def propose(self, req, op=op):
                t = op(self, req); exp_acc.append((t.size, getattr(t, "expected_accept", 0.0))); return t
            type(d).propose = propose
        rs = [sm.generate(p, mnt, method=None if m == "auto" else m, temperature=temp, seed=i) for i, p in enumerate(prompts)]
        if d is not None:
            type(d).propose = op
        ratio = collections.defaultdict(list)
        for size, length, sec in log:
            ratio[size if size < 4 else (4 if size < 8 else (8 if size < 16 else 16))].append(sec / curve.at(length).verify(size))
        acc = sum(sum(r.stats.accept_lengths[1:]) - len(r.stats.accept_lengths[1:]) for r in rs)
        line = f"{m:5s} tok/s {statistics.mean(r.tokens_per_second for r in rs):6.1f} tau {statistics.mean(r.tau for r in rs):.2f}"
        line += " verify/curve " + str({k: (len(v), round(statistics.median(v), 2)) for k, v in sorted(ratio.items())})
        if exp_acc:
            trees = [e for e in exp_acc if e[0] > 1]
            line += f" | rounds {len(exp_acc)} with a tree {len(trees)} mean size {statistics.mean(e[0] for e in exp_acc):.2f}"
            line += f" expected drafts {sum(e[1] for e in trees):.1f} accepted {acc}"
            line += " time split " + str({k: round(sum(getattr(r.stats, 'time_' + k) for r in rs), 2) for k in ("draft", "verify", "other")})
        print(line, flush=True)
