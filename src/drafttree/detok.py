"""Incremental detokenisation with stop strings: the text a stream may show after each step.

Text is re-decoded from all tokens (tokenizers merge bytes across tokens), a trailing replacement character
(half of a multi-byte character) is held back, and so are the last ``len(longest stop) - 1`` characters, which
a stop string completed by the next step could still swallow.
"""

from __future__ import annotations


class TextAssembler:
    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.tokens: list[int] = []
        self.emitted = ""
        self.stopped_at: int | None = None
        self.hold = max((len(s) for s in stops), default=1) - 1

    def feed(self, new: list[int], final: bool = False) -> str:
        """Add this step's tokens; returns the new text that is safe to show. ``final``: the sequence ended."""
        self.tokens.extend(new)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if self.stops:
            hits = [text.find(s, max(0, len(self.emitted) - self.hold)) for s in self.stops]
            hits = [h for h in hits if h >= 0]
            if hits:
                self.stopped_at = min(hits)
                text = text[: self.stopped_at]
        final = final or self.stopped_at is not None
        safe = text if final else text.rstrip("\ufffd")
        if not final and self.hold:
            safe = safe[: max(len(self.emitted), len(safe) - self.hold)]
        delta, self.emitted = safe[len(self.emitted):], safe
        return delta

    def finish(self) -> str:
        """The text still held back when the sequence ends."""
        text = self.text
        delta = text[len(self.emitted):] if len(text) > len(self.emitted) else ""
        self.emitted = max(self.emitted, text, key=len)
        return delta

    @property
    def text(self) -> str:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        return text if self.stopped_at is None else text[: self.stopped_at]
