import sys, cProfile, pstats, torch
torch.set_num_threads(2)
import drafttree
from drafttree.bench.concurrency import interleaved_prompts, run_ours
from drafttree.bench.tasks import BUILTIN
sm = drafttree.load(dtype="bfloat16")
n = int(sys.argv[2]) if len(sys.argv) > 2 else 64
prompts = interleaved_prompts(list(BUILTIN), n)
spec = sys.argv[1] if len(sys.argv) > 1 else "ar"
run_ours(sm, prompts[:4], spec, 16)
from drafttree.batching import decode as bd
p = cProfile.Profile()
orig = bd.BatchDecoder.step
def step(self):
    p.enable(); r = orig(self); p.disable(); return r
orig_add = bd.BatchDecoder.add_many
def add_many(self, seqs):
    p.enable(); r = orig_add(self, seqs); p.disable(); return r
bd.BatchDecoder.add_many = add_many
bd.BatchDecoder.step = step
r = run_ours(sm, prompts, spec, 128)
print(spec, f"{sum(r['tokens'])/r['wall']:.1f}")
if len(sys.argv) > 3:  # a file for the stats (stop 55: logs/s55_prof_{spec}_{n}.pstats, queried by tottime)
    p.dump_stats(sys.argv[3])
st = pstats.Stats(p); st.sort_stats("cumulative").print_stats(40)
