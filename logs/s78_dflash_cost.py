"""Stop 78: what one DFlash drafter forward costs on the default target (bf16, 2 threads): a random drafter as wide as
SmolLM2 (logs/s78_dflash_cli.py writes it to /tmp/s78cli), 200 context positions, then rounds of 2 committed positions
and a block of 16 (every depth's log-probs, or a tree's three); the target's LM head over the 15 drafted positions
alone; and plain decoding's time per token in the same process. Usage: python logs/s78_dflash_cost.py"""

import time

import torch

from drafttree import kernels
from drafttree.api import SpeculativeModel
from drafttree.drafters.dflash import DFlashState
from drafttree.heads.loading import load_head
from drafttree.models import load_model

torch.set_num_threads(2)
t = load_model("smollm2-135m-instruct", dtype=torch.bfloat16, show_progress=False)
h = load_head("/tmp/s78cli/smollm2-dflash-b16", t)
H, N = 576, 50
st = DFlashState(h)
st.encode(torch.randn(200, 3 * H, dtype=torch.bfloat16), list(range(1, 201)), 0)
st.logprobs()


def timed(f, n=N) -> float:
    for _ in range(3):
        f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1000


def one_round():  # every depth's log-probs (a chain of the whole block)
    st.encode(torch.randn(2, 3 * H, dtype=torch.bfloat16), [5, 6], st.root_pos)
    st.logprobs()


def shallow_round():  # a tree three deep: the LM head for the depths the last round read and two more
    st.encode(torch.randn(2, 3 * H, dtype=torch.bfloat16), [5, 6], st.root_pos)
    st.root_logprobs()
    st.expand(torch.tensor([5]), torch.tensor([-1]), torch.ones(1, 1, dtype=torch.bool), 2)


x = torch.randn(15, H, dtype=torch.bfloat16)
print(f"drafter round (2 new context positions, block of 16), all 15 depths: {timed(one_round):.2f} ms")
print(f"  ... a tree 3 deep (the LM head for 3 depths): {timed(shallow_round):.2f} ms")
print(f"target LM head over 15 positions (torch): {timed(lambda: h.logits(x)):.2f} ms")
print(f"  ... with log-softmax: {timed(lambda: torch.log_softmax(h.logits(x).float(), -1)):.2f} ms")
print(f"  ... through kernels.linear: {timed(lambda: kernels.linear(x, h._lm_head[0].weight)):.2f} ms")
sm = SpeculativeModel(t, method="ar")
sm.generate("Write a short story about a lighthouse keeper.", max_new_tokens=16)
r = sm.generate("Write a short story about a lighthouse keeper.", max_new_tokens=128, ignore_eos=True)
print(f"plain decoding: {r.wall_time / r.new_tokens * 1000:.2f} ms per token (one target forward each)")
