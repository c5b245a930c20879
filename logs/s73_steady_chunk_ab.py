"""A steady load with chunked prefill (prefill_chunk 512, the default) against none (0), alternated in one process
(stop 73, a diagnostic): python logs/s73_steady_chunk_ab.py U R PAIRS METHOD

U users x R requests in turn each (the concurrency benchmark's steady load); per run the aggregate tokens/s and the
longest time any user waited between two of its tokens; the ratio of each pair."""
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402

users, per, pairs, method = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sm = drafttree.load(dtype="bfloat16")
prompts = interleaved_prompts(list(BUILTIN), users * per)


def run(chunk):
    sm.prefill_chunk = chunk
    last, gap, tokens = {}, 0.0, 0
    t0 = time.perf_counter()
    for i, c in sm.stream_batch(prompts, 128, method=None if method == "auto" else method, max_batch=users):
        now = time.perf_counter()
        if i in last:
            gap = max(gap, now - last[i])
        last[i] = now
        tokens += len(c.tokens)
    wall = time.perf_counter() - t0
    return tokens / wall, gap


run(512)
print(f"# python logs/s73_steady_chunk_ab.py {' '.join(sys.argv[1:])}")
res = {512: [], 0: []}
for r in range(pairs):
    for c in ((512, 0) if r % 2 == 0 else (0, 512)):
        res[c].append(run(c))
        print(f"prefill_chunk={c:3d}: {res[c][-1][0]:6.1f} tok/s, longest wait between a user's tokens "
              f"{res[c][-1][1] * 1e3:6.0f} ms", flush=True)
x = [a[0] / b[0] for a, b in zip(res[512], res[0])]
print(f"512 / 0, each pair: {', '.join(f'{v:.3f}' for v in x)}; mean {statistics.mean(x):.3f}, median "
      f"{statistics.median(x):.3f}")
