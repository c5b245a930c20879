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


@pytest.mark.parametrize("clean,skip", [(False, True), (True, True), (False, False)])
def test_the_text_is_the_full_decode_at_every_step(default_fp32, clean, skip):
    """... with special tokens' text dropped (the default) or kept (skip_special_tokens false, e.g. for a tool-call
    parser), among them the chat template's own tokens."""
    tok = default_fp32.tokenizer
    dec = Cleaning(tok) if clean else tok
    rng = random.Random(1)
    special = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    streams = list(_token_streams(tok, rng)) + [special[:1] + tok("assistant\nHi")["input_ids"] + special[1:]]
    for ids in streams:
        for _trial in range(3):
            asm, shown, i = TextAssembler(dec, [], skip_special=skip), "", 0
            while i < len(ids):
                step = ids[i:i + rng.randint(1, 4)]
                i += len(step)
                shown += asm.feed(step, final=i >= len(ids))
                full = dec.decode(ids[:i], skip_special_tokens=skip)
                assert asm._decode_all() == full
                assert full.startswith(shown)
            assert shown + asm.finish() == asm.text == dec.decode(ids, skip_special_tokens=skip)
    assert "<|im_end|>" in dec.decode(streams[-1], skip_special_tokens=skip) or skip


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


class ByteTokens:
    """A byte-level tokenizer over a fixed table (decode joins bytes, U+FFFD for a partial character, as Hugging Face's
    byte-level decoders do)."""

    def __init__(self, table: list[bytes]):
        self.table = table

    def decode(self, ids, skip_special_tokens=True):
        return b"".join(self.table[i] for i in ids).decode("utf-8", "replace")


def test_kept_keeps_the_token_that_completes_a_character_before_the_stop():
    tok = ByteTokens([b"Great", b" job", b" \xf0\x9f", b"\x98\x80", b"\n", b"Bye"])
    asm = TextAssembler(tok, ["\n"])
    asm.feed([0, 1, 2])
    asm.feed([3, 4, 5])
    assert asm.text == "Great job 😀" and asm.kept() == 4 and tok.decode(asm.tokens[:asm.kept()]) == asm.text
    for stop, kept in (("😀", 3), (" job", 1), ("Great", 0)):  # a stop at or before the character
        asm = TextAssembler(tok, [stop])
        asm.feed([0, 1, 2, 3, 4, 5])
        assert asm.kept() == kept, stop


def test_releasable_holds_back_tokens_whose_text_a_stop_string_may_still_cut():
    """A stream hands out a token only once its text is shown: a stop string found a step later never takes back a
    token already handed out."""
    tok = ByteTokens([b"Hello", b" there", b",", b" 7", b" more"])
    asm = TextAssembler(tok, [", 7"])
    asm.feed([0, 1, 2])
    assert asm.emitted == "Hello ther" and asm.releasable() == 1  # the last 2 characters are held, " there" with them
    asm.feed([3, 4])
    assert asm.stopped_at == 11 and asm.releasable() == asm.kept() == 2  # "," begins the stop string: never out
    assert TextAssembler(tok, []).releasable() == 0
    plain = TextAssembler(tok, [])
    plain.feed([0, 1, 2])
    assert plain.releasable() == 3  # no stop strings: every token goes out at once
