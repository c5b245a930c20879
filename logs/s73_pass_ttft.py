"""Short newcomers behind a long one that is prefilled in chunks: arrival order against letting them pass (stop 73,
a diagnostic): python logs/s73_pass_ttft.py ROWS LONG_TOKENS REPEATS

ROWS users decode (the benchmark's interleaved first turns, 160 new tokens); after 8 rounds a newcomer with ~LONG_TOKENS
tokens (logs/s72_long_train.jsonl's texts) asks for 32 tokens, and one round later 3 short newcomers (the next
interleaved first turns) ask for 32 each. Admission.PASS_SHARE 0 (arrival order) and 0.5 (the default) alternated:
the short newcomers' mean time to first token, the long one's, the longest gap of a running row, the run's tokens/s."""
import json
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
import drafttree  # noqa: E402
from drafttree.accept import Sampling  # noqa: E402
from drafttree.batching import BatchDecoder, Sequence  # noqa: E402
from drafttree.batching.admission import Admission  # noqa: E402
from drafttree.bench.concurrency import interleaved_prompts  # noqa: E402
from drafttree.bench.tasks import BUILTIN  # noqa: E402
from drafttree.drafters import make_drafter  # noqa: E402

rows, long_tokens, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sm = drafttree.load(dtype="bfloat16")
with open("logs/s72_long_train.jsonl") as f:
    texts = [json.loads(line)["turns"][0] for line in f]
ids = sm.tokenizer("\n\n".join(texts), return_tensors="pt").input_ids[0][:long_tokens]
long_prompt = "Summarize these texts in one paragraph.\n\n" + sm.tokenizer.decode(ids)
prompts = interleaved_prompts(list(BUILTIN), rows + 3)
method = sm._resolve_method("auto")


def seq(prompt, n):
    return Sequence(sm.encode_prompt(prompt), make_drafter(method, sm.target, sm.draft, sm.head, **sm.method_options),
                    Sampling(), n, frozenset(sm.eos_ids))


def run(share):
    Admission.PASS_SHARE = share
    bt = sm.batch_target()
    bt.keep([])
    dec = BatchDecoder(bt, sm.verify_cost(), sm.batch_policy)
    t0 = time.perf_counter()
    running = [seq(p, 160) for p in prompts[:rows]]
    dec.add_many(running)
    asked, first, last, gap, r = {}, {}, {id(s): time.perf_counter() for s in running}, 0.0, 0
    late, shorts = seq(long_prompt, 32), [seq(p, 32) for p in prompts[rows:]]
    while dec.rows:
        for when, news in ((8, [late]), (9, shorts)):
            if r == when:
                for s in news:
                    asked[id(s)] = time.perf_counter()
                for s, new in zip(news, dec.add_many(news)):
                    if new is not None:
                        first[id(s)] = time.perf_counter() - asked[id(s)]
        out = dec.step()
        now = time.perf_counter()
        r += 1
        for s, new in out:
            if id(s) in asked and id(s) not in first and new:
                first[id(s)] = now - asked[id(s)]
            if id(s) in last and new:
                gap = max(gap, now - last[id(s)]) if r > 8 else gap
                last[id(s)] = now
    wall = time.perf_counter() - t0
    tokens = sum(len(s.tokens) for s in running + shorts + [late])
    return statistics.mean(first[id(s)] for s in shorts), first[id(late)], gap, tokens / wall


run(0.5)
print(f"# python logs/s73_pass_ttft.py {' '.join(sys.argv[1:])}")
res = {0.0: [], 0.5: []}
for rep in range(repeats):
    for share in ((0.0, 0.5) if rep % 2 == 0 else (0.5, 0.0)):
        res[share].append(run(share))
        s, lt, g, tps = res[share][-1]
        print(f"PASS_SHARE={share}: short newcomers' first token after {s:.3f} s (mean of 3), the long one's after "
              f"{lt:.3f} s, longest gap {g * 1e3:.0f} ms, {tps:.1f} tok/s", flush=True)
for share, v in res.items():
    print(f"PASS_SHARE={share} medians: short {statistics.median(x[0] for x in v):.3f} s, long "
          f"{statistics.median(x[1] for x in v):.3f} s, gap {statistics.median(x[2] for x in v) * 1e3:.0f} ms, "
          f"{statistics.median(x[3] for x in v):.1f} tok/s")
