"""Stop 53 diagnostic (not the benchmark): auto against auto:live_curve=true, interleaved per prompt, on the longest
training prompts (not a benchmark task), with the live curve's ratios at the end. Usage: s53_live_ab.py [n] [tokens] [temp]"""
import sys, json, statistics, torch
torch.set_num_threads(2)
import drafttree
n = int(sys.argv[1]) if len(sys.argv) > 1 else 6
mnt = int(sys.argv[2]) if len(sys.argv) > 2 else 128
temp = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
rows = [json.loads(l) for l in open("/tmp/hp/prompts-train.jsonl")]
rows.sort(key=lambda r: -len(r["messages"][0]["content"]))
prompts = [r["messages"] for r in rows[:n]]
sm = drafttree.load(dtype="bfloat16", show_progress=False)
arms = {"ar": dict(method="ar"), "auto": dict(method="auto"),
        "live": dict(method="auto", method_options={"live_curve": True})}
for kw in arms.values():
    sm.generate(prompts[0], 8, **kw)
res = {k: [] for k in arms}
for rep in range(2):
    for i, p in enumerate(prompts):
        for k, kw in arms.items():
            r = sm.generate(p, mnt, temperature=temp, seed=i, **kw)
            res[k].append(r)
for k, rs in res.items():
    print(k, "tok/s", round(statistics.mean(r.tokens_per_second for r in rs), 1), "tau", round(statistics.mean(r.tau for r in rs), 2),
          "mean tree", round(statistics.mean(x for r in rs for x in (r.stats.tree_sizes or [1])), 2))
d = sm.drafter("auto", {"live_curve": True})
print("live ratios", [None if x is None else round(x, 2) for x in d.live.ratios()], "seen", d.live.seen)
print("same text auto/live:", all(a.text == b.text for a, b in zip(res["auto"], res["live"])))
