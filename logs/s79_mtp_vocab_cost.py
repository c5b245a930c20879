"""Stop 79, a probe: what one draft level of a model's own MTP layer costs on a big-vocabulary target, with the LM head
over the whole vocabulary against a reduced draft vocabulary (as EAGLE-3 heads draft), next to plain decoding's time
per token in the same process. Qwen2.5-Coder-0.5B (151,936 tokens, 896 wide; its pack on this machine) with a random
MTP layer of Qwen3-Next's layout (its own decoder-layer class at index L), bf16, 2 threads; 200 committed positions,
then one node expanded per level (a chain) or 8 (a tree level). Usage: python logs/s79_mtp_vocab_cost.py"""

import time

import torch

from drafttree.api import SpeculativeModel
from drafttree.drafters.eagle import EagleState
from drafttree.heads.mtp import LAYOUTS, MtpHead
from drafttree.models import load_model

torch.set_num_threads(2)
torch.manual_seed(0)
t = load_model("qwen2.5-coder-0.5b-instruct", dtype=torch.bfloat16, show_progress=False)
head = MtpHead(t.model, next(x for x in LAYOUTS if x.name == "qwen3_next")).to(torch.bfloat16).eval()
H, V = t.model.config.hidden_size, t.model.get_output_embeddings().weight.shape[0]


def timed(f, n=40) -> float:
    for _ in range(3):
        f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1000


for vocab in (None, 65536, 32768, 16384):
    head.set_draft_vocab(None if vocab is None else torch.arange(vocab))
    st = EagleState(head)
    st.encode(torch.randn(200, H, dtype=torch.bfloat16), list(range(1, 201)), 0)
    st.root_logprobs()

    def level(m: int, st=st):
        st._crop()
        st.expand(torch.arange(5, 5 + m), torch.full((m,), -1), torch.eye(m, dtype=torch.bool), 1)

    print(f"draft vocab {vocab or V:>6}: one level, 1 node {timed(lambda: level(1)):.2f} ms, "
          f"8 nodes {timed(lambda: level(8)):.2f} ms")
sm = SpeculativeModel(t, method="ar")
prompt = t.tokenizer("def quicksort(items):", return_tensors="pt").input_ids[0]
sm.generate(prompt, max_new_tokens=16, ignore_eos=True)
t0 = time.perf_counter()
out = sm.generate(prompt, max_new_tokens=64, ignore_eos=True)
print(f"plain decoding: {(time.perf_counter() - t0) / out.new_tokens * 1000:.2f} ms per token (64 tokens)")
