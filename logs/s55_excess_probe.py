"""What the batch decoder learns: the forward's time beyond the curve at its token count, per row (a diagnostic)."""
import torch
torch.set_num_threads(2)
import drafttree
from drafttree.batching import decode as bd
from drafttree.bench.concurrency import interleaved_prompts, run_ours
from drafttree.bench.tasks import BUILTIN

seen = []
orig = bd.BatchDecoder._measure_excess
def spy(self, seconds, tokens, rows):
    seen.append((rows, tokens, seconds, self.cost.verify_in_batch(tokens)))
    return orig(self, seconds, tokens, rows)
bd.BatchDecoder._measure_excess = spy
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), 64)
run_ours(sm, prompts[:4], "ar", 8)
for u in (4, 16, 64):
    seen.clear()
    run_ours(sm, prompts[:u], "ar", 128, max_batch=u)
    full = [s for s in seen if s[0] == u]
    if full:
        meas = sorted(s[2] for s in full)[len(full) // 2]
        curve = full[0][3]
        print(f"{u:3d} rows: {len(full)} rounds with every row, forward median {1e3 * meas:.1f} ms, curve at "
              f"{full[0][1]} tokens {1e3 * curve:.1f} ms: {meas / curve:.2f}x", flush=True)
