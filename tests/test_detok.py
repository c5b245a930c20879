"""Incremental detokenisation: at every step the text is the full decode's, while each step decodes a short window."""

import random

import pytest

from drafttree.detok import TextAssembler

TEXTS = ["Hello , world ! It 's a test . Isn 't it ? Yes , it is .",
         "naïve café — 東京タワー 🙂 👩‍👩‍👧 ü ß ∑ ≠ and 12.5% of 3,000",
         "def f(x):\n    return x ** 2  # squares ?\n\nprint(f(3))\n",
         "  leading spaces, double  spaces,\ttabs\nand new lines\n\n\n"]


class Cleaning:
    """The tokenizer, its decode also cleaning up spaces before punctuation (as some tokenizers do by default)."""

    def __init__(self, tok):
        self.tok = tok

    def decode(self, ids, skip_special_tokens=True):
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=True)


def _token_streams(tok, rng):
    for text in TEXTS:
        yield tok(text)["input_ids"]
    vocab = len(tok)
    for _ in range(4):  # random ids: byte tokens that split characters, special tokens, anything
        yield [rng.randrange(vocab) for _ in range(60)]


@pytest.mark.parametrize("clean", [False, True])
def test_the_text_is_the_full_decode_at_every_step(default_fp32, clean):
    tok = default_fp32.tokenizer
    dec = Cleaning(tok) if clean else tok
    rng = random.Random(1)
    for ids in _token_streams(tok, rng):
        for _trial in range(3):
            asm, shown, i = TextAssembler(dec, []), "", 0
            while i < len(ids):
                step = ids[i:i + rng.randint(1, 4)]
                i += len(step)
                shown += asm.feed(step, final=i >= len(ids))
                full = dec.decode(ids[:i], skip_special_tokens=True)
                assert asm._decode_all() == full
                assert full.startswith(shown)
            assert shown + asm.finish() == asm.text == dec.decode(ids, skip_special_tokens=True)


def test_each_step_decodes_a_window_not_everything(default_fp32):
    """Fed one token at a time, 400 tokens of text cost ~400 short decodes, not 400 decodes of up to 400 tokens."""
    tok = default_fp32.tokenizer
    ids = tok(" ".join(TEXTS) * 8)["input_ids"][:400]
    sizes = []

    class Counting:
        def decode(self, x, skip_special_tokens=True):
            sizes.append(len(x))
            return tok.decode(x, skip_special_tokens=skip_special_tokens)

    asm = TextAssembler(Counting(), ["never appears"])
    for t in ids:
        asm.feed([t])
    assert asm.text == tok.decode(ids, skip_special_tokens=True)
    assert sum(sizes) < 20 * len(ids), f"{sum(sizes)} tokens decoded for {len(ids)}"
