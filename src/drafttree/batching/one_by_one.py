"""The batched decoder's interface over one sequence at a time, for a target that verifies chains only.

A model with recurrent layers (chain_target.py) keeps one state per sequence in its own cache, which drafttree does not
pack into rows; the server's scheduler still feeds it through :class:`~drafttree.batching.decode.BatchDecoder`'s
interface (``add`` / ``step`` / ``rows``), and this class runs the single-sequence decode loop (``decode.py``) behind
it: one request decodes, the others wait in the scheduler's bounded queue, a cancelled one leaves at the next round.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from drafttree.batching.decode import Sequence
from drafttree.decode import decode
from drafttree.errors import DraftTreeError
from drafttree.target import TargetModel


class _OneRow:
    """What the scheduler asks of a batch's target: its row limit, and keeping or dropping rows."""

    max_rows = 1

    def __init__(self, decoder: OneByOneDecoder):
        self.decoder = decoder

    def keep(self, rows: list[int]) -> None:
        if not rows:
            self.decoder.drop()

    def forget_buffers(self) -> None:
        self.decoder.single.forget()


class _NoQueue:
    queue: list[Sequence] = []

    def drop(self, seqs) -> None:
        pass


class OneByOneDecoder:
    """:meth:`add` a sequence (its prefill), :meth:`step` its next round; one sequence at a time."""

    def __init__(self, single: TargetModel):
        self.single = single
        self.target = _OneRow(self)
        self.admission = _NoQueue()
        self.active: list[Sequence] = []
        self.held_back: list[Sequence] = []
        self.waiting = 0
        self._steps: Iterator[list[int]] | None = None

    @property
    def rows(self) -> int:
        return len(self.active)

    def drop(self) -> None:
        if self._steps is not None:
            self._steps.close()
        self.active, self._steps = [], None

    @torch.inference_mode()
    def add(self, seq: Sequence) -> list[int]:
        if self.active:
            raise DraftTreeError("this model decodes 1 prompt(s) at a time (recurrent layers verify chains, and a "
                                 "Gemma 4 assistant drafts, for one sequence at a time)")
        self._steps = decode(self.single, seq.drafter, seq.prompt_ids, seq.sampling, seq.max_new_tokens, seq.eos_ids,
                             seq.generator, seq.stats, logprobs=seq.logprobs)
        try:
            first = self._next(seq)  # the prefill: a request it fails for never becomes the row
        except BaseException:
            self._steps = None
            raise
        self.active = [seq]
        return first

    def add_many(self, seqs: list[Sequence]) -> list[list[int]]:
        return [self.add(s) for s in seqs]

    def step(self) -> list[tuple[Sequence, list[int]]]:
        if not self.active:
            return []
        seq = self.active[0]
        if seq.finished:
            self.drop()
            return []
        if seq.cancelled:
            self.drop()
            seq._finish("cancelled")
            return [(seq, [])]
        return [(seq, self._next(seq))]

    def _next(self, seq: Sequence) -> list[int]:
        try:
            new = next(self._steps)
        except StopIteration:  # the context window is full
            seq._finish(seq.stats.finish_reason)
            return []
        seq.tokens.extend(new)
        seq.context.extend(new)
        if new and new[-1] in seq.eos_ids:
            seq._finish("stop")
        elif seq.stats.new_tokens >= seq.max_new_tokens:
            seq._finish("length")
        return new
