"""Tokens decoded to stream a 2,048-token answer token by token (a deterministic count, old rule = every prefix)."""
from drafttree.detok import TextAssembler
from drafttree.models import load_model

tok = load_model("smollm2-135m-instruct", dtype="float32", device="cpu", show_progress=False).tokenizer
text = open("README.md").read()
ids = tok(text)["input_ids"][:2048]
sizes = []


class Counting:
    def decode(self, x, skip_special_tokens=True):
        sizes.append(len(x))
        return tok.decode(x, skip_special_tokens=skip_special_tokens)


asm = TextAssembler(Counting(), [])
for t in ids:
    asm.feed([t])
assert asm.text == tok.decode(ids, skip_special_tokens=True)
print(f"{len(ids)} tokens streamed one at a time: {sum(sizes)} tokens decoded in {len(sizes)} calls "
      f"(every prefix: {len(ids) * (len(ids) + 1) // 2}); calls over 16 tokens: {sum(s > 16 for s in sizes)}")
