"""Single-sequence `auto` with this stop's changes toggled (diagnostic): python logs/s66_single_ab.py FREEZE LAZY
(0/1 each). Decodes the six tasks' first turns (two each), 128 tokens, bf16, 2 threads; prints tokens/s and tau."""
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree import cache  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

freeze, lazy = sys.argv[1] == "1", sys.argv[2] == "1"
if not lazy:
    cache.LAZY_BYTES = 1 << 62
sm = drafttree.load(dtype="bfloat16", freeze_gc=freeze, show_progress=False)
prompts = interleaved_prompts(list(BUILTIN), 12)
sm.generate(prompts[0], max_new_tokens=16)
toks, wall, taus = 0, 0.0, []
for p in prompts:
    t0 = time.perf_counter()
    r = sm.generate(p, max_new_tokens=128)
    wall += time.perf_counter() - t0
    toks += r.new_tokens
    taus.append(r.tau)
print(f"freeze {int(freeze)} lazy {int(lazy)}: {toks / wall:.1f} tok/s, tau {sum(taus) / len(taus):.2f}")
