"""Text offsets of a logprob request's tokens (stop 56): the old way (each token's prefix decoded whole, as
server/scheduler.py's _logprobs did) against detok.PrefixEnds (a window), on the default tokenizer, with the answer
fed 4 tokens a step. Checks that both give the same offsets. Usage: python logs/s56_logprob_cost.py [tokens]"""
import sys
import time

import drafttree
from drafttree.detok import PrefixEnds

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
tok = drafttree.load(dtype="bfloat16").tokenizer
text = ("Speculative decoding drafts tokens cheaply, then the target verifies them in one forward. 😀 日本語 "
        "naïve café — ünïcödé. ") * 200
ids = tok(text, add_special_tokens=False).input_ids[:n]
t0 = time.perf_counter()
old = [len(tok.decode(ids[: i + 1], skip_special_tokens=True)) for i in range(len(ids))]
t_old = time.perf_counter() - t0
ends, t0 = PrefixEnds(tok), time.perf_counter()
for a in range(0, len(ids), 4):
    ends.update(ids[: a + 4])
t_new = time.perf_counter() - t0
assert ends.ends == old, "offsets differ"
print(f"{len(ids)} tokens: prefix decodes {t_old:.3f} s, PrefixEnds {t_new:.3f} s (same offsets)")
