"""A burst's prefill with the cache's lazily mapped zeros against eager ones (diagnostic): 64 prompts (the six
tasks' first turns interleaved) prefilled together, then 16 plain rounds, timed, alternating the two in one process.
Usage: python logs/s66_prefill_ab.py 64 3"""
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree import cache  # noqa: E402
from drafttree.batching import BatchTarget  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402
from drafttree.tree import DraftTree  # noqa: E402

users, pairs = int(sys.argv[1]), int(sys.argv[2])
sm = drafttree.load(dtype="bfloat16")
ids = [torch.tensor(sm.tokenizer(p)["input_ids"]) for p in interleaved_prompts(list(BUILTIN), users)]
model = sm.target.model
lazy = cache.LAZY_BYTES
spent = [0.0]
_zeros = cache.zeros


def timed_zeros(*a, **k):
    t = time.perf_counter()
    try:
        return _zeros(*a, **k)
    finally:
        spent[0] += time.perf_counter() - t


cache.zeros = timed_zeros
for i in range(2 * pairs):
    on = (i % 2 == 0) == (i // 2 % 2 == 0)
    cache.LAZY_BYTES = lazy if on else 1 << 62
    bt, spent[0] = BatchTarget(model), 0.0
    t0 = time.perf_counter()
    outs = bt.add_many(ids, [128] * users)
    t1 = time.perf_counter()
    for _ in range(16):
        bt.forward_trees([DraftTree.root_only(int(o.logits[-1].argmax()), "cpu") for o in outs])
        bt.commit([[0]] * users)
    t2 = time.perf_counter()
    print(f"{'lazy ' if on else 'eager'} prefill {t1 - t0:.2f} s, 16 rounds {t2 - t1:.2f} s, buffers {spent[0]:.2f} s", flush=True)
    del bt, outs
