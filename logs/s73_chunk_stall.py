"""A long prompt joining a decoding batch, with and without chunked prefill (stop 73, a diagnostic):
python logs/s73_chunk_stall.py ROWS LONG_TOKENS REPEATS METHOD CHUNK...

ROWS users decode (the benchmark's interleaved first turns, 160 new tokens each); after 8 rounds a newcomer with a
prompt of ~LONG_TOKENS tokens (long web texts: logs/s72_long_train.jsonl, joined) asks for 32 tokens. Per setting of
``prefill_chunk`` (alternated, REPEATS times): the longest and the median gap between a running row's consecutive
tokens once the newcomer arrived, the newcomer's time to its first token, the whole run's seconds and tokens/s."""
import json
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.accept import Sampling  # noqa: E402
from drafttree.batching import BatchDecoder, Sequence  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402
from drafttree.drafters import make_drafter  # noqa: E402

rows, long_tokens, repeats, method = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
chunks = [int(c) for c in sys.argv[5:]]
sm = drafttree.load(dtype="bfloat16")
with open("logs/s72_long_train.jsonl") as f:
    texts = [json.loads(line)["turns"][0] for line in f]
ids = sm.tokenizer("\n\n".join(texts), return_tensors="pt").input_ids[0][:long_tokens]
long_prompt = "Summarize these texts in one paragraph.\n\n" + sm.tokenizer.decode(ids)
shorts = interleaved_prompts(list(BUILTIN), rows)
resolved = sm._resolve_method(method)


def seq(prompt, n):
    d = make_drafter(resolved, sm.target, sm.draft, sm.head, **(sm.method_options if resolved == sm.method else {}))
    return Sequence(sm.encode_prompt(prompt), d, Sampling(), n, frozenset(sm.eos_ids))


def run(chunk):
    bt = sm.batch_target()
    bt.keep([])
    dec = BatchDecoder(bt, sm.verify_cost(), sm.batch_policy, prefill_chunk=chunk)
    t0 = time.perf_counter()
    running = [seq(p, 160) for p in shorts]
    dec.add_many(running)
    last = {id(s): time.perf_counter() for s in running}
    gaps, late, asked, first, tokens, r = [], None, None, None, 0, 0
    while dec.rows:
        if r == 8:
            late = seq(long_prompt, 32)
            asked = time.perf_counter()
            if dec.add(late) is not None:
                first = time.perf_counter() - asked
        out = dec.step()
        now = time.perf_counter()
        r += 1
        for s, new in out:
            if s is late and first is None and new:
                first = now - asked
            if id(s) in last and new:
                if asked is not None:
                    gaps.append(now - last[id(s)])
                last[id(s)] = now
    wall = time.perf_counter() - t0
    tokens = sum(len(s.tokens) for s in running) + len(late.tokens)
    return max(gaps), statistics.median(gaps), first, wall, tokens / wall, late.prompt_ids.numel()


run(0)
print(f"# python logs/s73_chunk_stall.py {' '.join(sys.argv[1:])}")
res = {c: [] for c in chunks}
for rep in range(repeats):
    for c in (chunks if rep % 2 == 0 else chunks[::-1]):
        res[c].append(run(c))
        g, m, f, w, tps, n = res[c][-1]
        print(f"prefill_chunk={c:5d}: longest gap {g * 1e3:7.1f} ms, median gap {m * 1e3:5.1f} ms, newcomer "
              f"({n} tokens) first token after {f:.3f} s; run {w:.2f} s, {tps:.1f} tok/s", flush=True)
for c in chunks:
    print(f"prefill_chunk={c:5d} medians: longest gap {statistics.median(x[0] for x in res[c]) * 1e3:.1f} ms, first "
          f"token {statistics.median(x[2] for x in res[c]):.3f} s, {statistics.median(x[4] for x in res[c]):.1f} tok/s")
