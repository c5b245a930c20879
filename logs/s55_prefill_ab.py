"""Prefill of a burst's newcomers and the whole burst (batched ar), for whichever drafttree is on the path: run it
alternately with the code before and after a change (PYTHONPATH), nothing else running."""
import sys, time, torch
torch.set_num_threads(2)
import drafttree
from drafttree.batching import decode as bd
from drafttree.bench.concurrency import interleaved_prompts, run_ours
from drafttree.bench.tasks import BUILTIN

users = [int(u) for u in sys.argv[1].split(",")]
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), max(users))
run_ours(sm, prompts[:4], "ar", 8)
spent = []
orig = bd.BatchDecoder.add_many
def timed(self, seqs):
    t0 = time.perf_counter(); r = orig(self, seqs); spent.append(time.perf_counter() - t0); return r
bd.BatchDecoder.add_many = timed
for u in users:
    spent.clear()
    r = run_ours(sm, prompts[:u], "ar", 128, max_batch=u)
    print(f"{drafttree.__file__.split('/src/')[0]} {u} users prefill {sum(spent):.2f} s burst {r['wall']:.2f} s "
          f"{sum(r['tokens']) / r['wall']:.1f} tok/s", flush=True)
