"""A 3,000-token prompt prefilled whole against in chunks of a round's budget (stop 73, a diagnostic):
python logs/s73_chunk_cost.py

Long web texts (logs/s72_long_train.jsonl, joined, first 3,000 tokens) on a single-sequence target: one prefill, then
the chunks admission.py would take with budgets of 512 and 256 (each chunk's tokens counted with the keys they read);
seconds in all and milliseconds per chunk. Twice."""
import json
import time

import torch

import drafttree
from drafttree.batching.admission import MIN_CHUNK, keys_per_token, tokens_within
from drafttree.target import TargetModel

torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
with open("logs/s72_long_train.jsonl") as f:
    texts = [json.loads(line)["turns"][0] for line in f]
ids = sm.tokenizer("\n\n".join(texts), return_tensors="pt").input_ids[0][:3000]
model = sm.target.model
k = keys_per_token(model)


def whole():
    t = TargetModel(model, None, keep_prefix=True)
    t0 = time.perf_counter()
    t.prefill(ids)
    return time.perf_counter() - t0


def chunked(budget):
    t = TargetModel(model, None, keep_prefix=True)
    done, times = 0, []
    t0 = time.perf_counter()
    while done < len(ids):
        end = min(len(ids), done + max(MIN_CHUNK, tokens_within(budget, done, k)))
        t1 = time.perf_counter()
        t.prefill(ids[:end])
        times.append(round((time.perf_counter() - t1) * 1e3))
        assert t.reused == done  # each chunk computed only its own tokens
        done = end
    return time.perf_counter() - t0, times


print("# python logs/s73_chunk_cost.py")
whole()
for _ in range(2):
    print("whole", round(whole(), 3))
    for b in (512, 256):
        tot, times = chunked(b)
        print("chunked", b, round(tot, 3), times)
