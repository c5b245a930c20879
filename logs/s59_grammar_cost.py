"""Diagnostic (stop 59): what a grammar costs per round, outside the model. Masks of an 8-node chain inside a JSON
string and of a lone root (the depth-first walk through llguidance's matcher), and the masked logits as the decode
loop takes them (penalties.adjusted: copy to float32 scratch + the kernel's word-by-word -inf).
Usage: python logs/s59_grammar_cost.py"""
import time

import torch

import drafttree
from drafttree.penalties import adjusted
from drafttree.tree import DraftTree

torch.set_num_threads(2)
sm = drafttree.load(dtype="bfloat16")
s = sm.sampling(json_schema=True)
st = s.grammar.start()
ids = sm.tokenizer('{\n  "name": "Al', add_special_tokens=False).input_ids
toks = sm.tokenizer('ice", "age": 31', add_special_tokens=False).input_ids
ctx = list(range(50)) + ids
st.sync(ids)
tree, one = DraftTree.chain(ids[-1], toks[:7]), DraftTree.root_only(ids[-1])
logits = torch.randn(8, sm.target.vocab_size).bfloat16()


def us(f, n=300):
    f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e6


print(f"masks, 8-node chain: {us(lambda: st.bitmasks(tree)):.0f} us; lone root: {us(lambda: st.bitmasks(one)):.0f} us")
print(f"adjusted logits, 8 nodes: {us(lambda: adjusted(s, logits, tree, ctx, 50, {2}, st)):.0f} us; "
      f"lone root: {us(lambda: adjusted(s, logits[:1], one, ctx, 50, {2}, st)):.0f} us")
