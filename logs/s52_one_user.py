"""Stop 52 diagnostic (not the benchmark): one user's prompt of `bench concurrency`, auto vs ar, alone and as a 1-row
batch, with the time split and per-round notes. Usage: s52_one_user.py [n_prompts] [max_new_tokens]"""
import sys, time, statistics, torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
sm = drafttree.load(dtype="bfloat16")
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
mnt = int(sys.argv[2]) if len(sys.argv) > 2 else 128
prompts = interleaved_prompts(list(BUILTIN), n)
sm.generate(prompts[0], 16, method="ar"); sm.generate(prompts[0], 16)
for rep in range(2):
    for p_i, p in enumerate(prompts):
        for m in ("ar", "auto"):
            r = sm.generate(p, mnt, method=None if m == "auto" else m, record_rounds=(m == "auto"))
            s = r.stats
            print(f"p{p_i} {m:5s} {r.tokens_per_second:6.1f} tok/s tau {r.tau:.2f} fwd {s.target_forwards} "
                  f"prefill {s.time_prefill*1e3:.0f} draft {s.time_draft*1e3:.0f} verify {s.time_verify*1e3:.0f} "
                  f"other {s.time_other*1e3:.0f} ms  tree {statistics.mean(s.tree_sizes) if s.tree_sizes else 1:.1f}")
            if m == "auto" and rep == 1 and p_i == 0:
                from collections import Counter
                print(Counter(tuple(sorted(x.get('sources', []))) for x in s.rounds))
                print([ (x.get('tree_tokens'), x.get('depth')) for x in s.rounds][:60])
                print(s.accept_lengths[:60])
