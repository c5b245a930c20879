"""Incremental detokenisation with stop strings: the text a stream may show after each step.

Each step decodes a window of the last tokens, not all of them (tokenizers merge bytes across tokens, so a window
starts a few tokens back, at a point where the text so far ended on a whole character): the text of the tokens
before the window is kept, and the window's text past its own first part is appended. Where the window's text does
not extend its first part's (a tokenizer's clean-up of spaces across the seam), the step decodes everything, so the
text is always the full decode's. A trailing replacement character (half of a multi-byte character) is held back,
and so are the last ``len(longest stop) - 1`` characters, which a stop string completed by the next step could still
swallow.
"""

from __future__ import annotations


def min_tokens_of(sampling) -> int:
    """The tokens a generation makes before stop strings count (vLLM's min_tokens)."""
    return sampling.adjust.min_tokens if getattr(sampling, "adjust", None) is not None else 0


class TextAssembler:
    def __init__(self, tokenizer, stops: list[str], include_stop: bool = False, min_tokens: int = 0,
                 end_ids: frozenset[int] = frozenset(), skip_special: bool = True):
        """As vLLM: ``include_stop`` (include_stop_str_in_output): the text ends after the stop string found, not
        before it, and keeps the text of the end token that ended the generation (``end_ids``: end-of-sequence and
        stop_token_ids; dropped otherwise, the token still counted); stop strings count only once more than
        ``min_tokens`` tokens are out; ``skip_special`` (skip_special_tokens): special tokens have no text (False:
        they do, as a tool-call parser reading Qwen's ``<tool_call>`` tokens needs)."""
        self.tokenizer, self.stops, self.include_stop = tokenizer, stops, include_stop
        self.skip_special = skip_special
        self.min_tokens, self.end_ids = min_tokens, end_ids
        self.tokens: list[int] = []
        self.emitted = ""
        self.stopped_at: int | None = None  # where the text is cut, once a stop string was found
        self.text_end: int | None = None  # where it is cut when an end token's text is dropped
        self.hold = max((len(s) for s in stops), default=1) - 1
        # the window: tokens [start, seam) decode to ``head``, [0, seam) to ``known`` (which ends on a whole character)
        self._start = self._seam = 0
        self._known = self._head = ""
        self._ends: PrefixEnds | None = None  # where each token's text ends (releasable, with stop strings)

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=self.skip_special)

    CONTEXT = 4  # tokens before the seam the window starts with (their text gives the next ones' spacing)

    def _decode_all(self) -> str:
        """The text of every token so far (the full decode), from the window where it is exact."""
        decode, toks = self._decode, self.tokens
        window = decode(toks[self._start:])
        if window.startswith(self._head):
            text = self._known + window[len(self._head):]
        else:  # the seam changed the text before it: decode everything
            text = decode(toks)
        if not text.endswith("\ufffd"):  # a whole character: the seam moves to the end
            self._seam, self._known = len(toks), text
            self._start, self._head = 0, text  # no window, unless one spells its tokens as the full text does
            for back in (self.CONTEXT, 2 * self.CONTEXT, 4 * self.CONTEXT):  # (one starting inside a character
                start = len(toks) - back  # does not: a multi-byte character's tokens, an emoji's)
                if start <= 0:
                    break
                head = decode(toks[start:])
                if text.endswith(head) and not head.startswith("\ufffd"):
                    self._start, self._head = start, head
                    break
        return text

    def feed(self, new: list[int], final: bool = False) -> str:
        """Add this step's tokens; returns the new text that is safe to show. ``final``: the sequence ended."""
        self.tokens.extend(new)
        text = self._decode_all()
        if final and not self.include_stop and self.tokens and self.tokens[-1] in self.end_ids:
            self.text_end = min(len(text), len(self._decode(self.tokens[:-1])))
            text = text[: self.text_end]
        if self.stops and len(self.tokens) > self.min_tokens:
            hits = [(text.find(s, max(0, len(self.emitted) - self.hold)), -len(s)) for s in self.stops]
            hits = [h for h in hits if h[0] >= 0]
            if hits:  # the first stop string in the text (of those starting there, the longest)
                at, minus_len = min(hits)
                self.stopped_at = at - minus_len if self.include_stop else at
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

    def kept(self) -> int:
        """How many of the tokens count: all, or where a stop string cut the text, those that begin before it (a token
        the stop string starts inside is kept; tokens drafted and accepted past it are not, whatever the method)."""
        n = len(self.tokens)
        if self.stopped_at is None:
            return n
        # where token n-1 begins: the text before it, less half a character it completes (U+FFFD until then)
        while n > 0 and len(self._decode(self.tokens[: n - 1]).rstrip("\ufffd")
                            ) >= self.stopped_at:
            n -= 1
        return n

    def releasable(self) -> int:
        """How many of the tokens a stream may hand out with the text shown so far: with stop strings, those whose text
        went out (text held back for a stop string holds back its tokens too, so a stream never hands out a token
        the stop string then cuts); once stopped, :meth:`kept`; without stop strings, all of them."""
        if not self.stops:
            return len(self.tokens)
        if self.stopped_at is not None:
            return self.kept()
        if self._ends is None:
            self._ends = PrefixEnds(self.tokenizer, self.skip_special)
        ends, shown = self._ends.update(self.tokens), len(self.emitted)
        n = len(self.tokens)
        while n > 0 and ends[n - 1] > shown:
            n -= 1
        return n

    @property
    def text(self) -> str:
        text = self._decode(self.tokens)
        if self.stopped_at is not None:
            return text[: self.stopped_at]
        return text if self.text_end is None else text[: self.text_end]


class PrefixEnds:
    """Where each token's text ends: ``len(decode(tokens[:i + 1]))`` for every token i, in order, each from a window
    of the last tokens (a :class:`TextAssembler` fed one token at a time) instead of a decode of the whole prefix
    (a log-probability request's text offsets: quadratic in the answer's length otherwise)."""

    def __init__(self, tokenizer, skip_special: bool = True):
        self._text = TextAssembler(tokenizer, [], skip_special=skip_special)
        self.ends: list[int] = []

    def update(self, tokens: list[int]) -> list[int]:
        """The ends of ``tokens`` (which extend the tokens given before), computed for the new ones only."""
        for t in tokens[len(self.ends):]:
            self._text.tokens.append(t)
            self.ends.append(len(self._text._decode_all()))
        return self.ends
