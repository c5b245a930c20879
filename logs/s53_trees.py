"""Stop 53 diagnostic (not the benchmark): auto's trees with head I (shipped) and head H on the same prompts, T=0:
mean tree size, tau, each source's accepted drafts per forward. Tree sizing reads the cached curve and counters only,
so these are deterministic. Usage: s53_trees.py HEAD_DIR_H [n_prompts] [max_new_tokens]"""
import sys, statistics, torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts
from drafttree.bench.tasks import BUILTIN
n = int(sys.argv[2]) if len(sys.argv) > 2 else 12
mnt = int(sys.argv[3]) if len(sys.argv) > 3 else 128
prompts = interleaved_prompts(list(BUILTIN), n)
for name, head in (("I", "auto"), ("H", sys.argv[1])):
    sm = drafttree.load(head=head, dtype="bfloat16", show_progress=False)
    sizes, acc, fw, src = [], 0, 0, {}
    for p in prompts:
        r = sm.generate(p, mnt, record_rounds=True)
        sizes += r.stats.tree_sizes; acc += sum(r.stats.accept_lengths); fw += len(r.stats.accept_lengths)
        d = sm._drafter if hasattr(sm, "_drafter") else None
        for x in r.stats.rounds:
            for s in x.get("sources", []):
                src[s] = src.get(s, 0) + 1
    print(name, "mean tree", round(statistics.mean(sizes), 2), "tau", round(acc / fw, 3), "forwards", fw,
          "rounds with each source in the tree", src)
