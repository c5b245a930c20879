"""Whether a batched round drafts at all.

The default, :class:`AlwaysDraft`, leaves it to each row: every row's drafter sizes its own tree on its
:class:`~drafttree.budget.BatchShare` (the batch's tokens per second: its tokens and the other rows' over the
round's forward), so a node is verified only where it pays for the whole batch and a row whose drafts do not pay
verifies its root alone; in a batch a hybrid drafter uses only its free sources (context n-grams), so
rows do not each pay a head's or a draft LM's forward against one shared forward.

:class:`DraftOrPlain` is the alternative that measures: per batch-size bucket, the tokens per second of rounds
with drafts and of plain rounds (every row verifies its root only), the better used and the other probed now and
then. It is not the default because those measurements mislead on a CPU: rounds differ by what else happens in
them (rows joining and leaving, the content of the rows) by more than the modes differ (with ``ar``, whose
drafting rounds are plain rounds too, the two modes measured 25% apart), so it settled on the wrong mode in a
steady load of 4 users where per-row budgets gained on plain decoding (docs/benchmark-notes.md).
"""

from __future__ import annotations


def bucket(rows: int) -> int:
    """1, 2, 4, 8, ...: batch sizes within a factor of two share what was measured."""
    return 1 << (max(1, rows).bit_length() - 1)


class DraftOrPlain:
    """Per batch-size bucket, the measured better of drafting and plain rounds, probing the other now and then.

    A probe lasts ``probe_rounds`` rounds and the first round after any switch of mode is not measured: it pays
    for the drafters catching up on what the plain rounds committed (an EAGLE head encodes the backlog), a cost
    of the switch, not of the mode. A failed probe multiplies the wait before the next one by ``growth``."""

    def __init__(self, probe: int = 8, max_probe: int = 256, decay: float = 0.8, growth: int = 4,
                 probe_rounds: int = 3):
        self.probe, self.max_probe, self.decay, self.growth = probe, max_probe, decay, growth
        self.probe_rounds = max(1, probe_rounds)
        self.rate: dict[tuple[int, bool], float] = {}  # (bucket, drafted) -> tokens per second (EMA)
        self.wait: dict[tuple[int, bool], int] = {}
        self.since: dict[int, int] = {}
        self._probe: tuple[int, bool, int] | None = None  # (bucket, mode, rounds left) while a probe runs
        self._ending: tuple[int, bool] | None = None  # the probe whose last round this is
        self._last: bool | None = None  # the previous round's mode
        self._sums: dict[tuple[int, bool], tuple[float, float]] = {}

    def _nearest(self, b: int) -> int | None:
        """The measured batch size closest to ``b`` (in factors of two), for a size not measured yet."""
        known = {k for (k, _) in self.rate if (k, True) in self.rate and (k, False) in self.rate}
        return min(known, key=lambda k: (abs(k.bit_length() - b.bit_length()), -k)) if known else None

    def _best(self, b: int) -> bool:
        if (b, True) in self.rate and (b, False) in self.rate:
            return self.rate[(b, True)] >= self.rate[(b, False)]
        near = self._nearest(b)
        return self.rate[(near, True)] >= self.rate[(near, False)] if near is not None else b == 1

    def choose(self, rows: int) -> bool:
        """True: this round drafts. An unmeasured size starts in the mode that won at the nearest measured size
        (with nothing measured: drafting alone, plain in a batch) and probes the other after ``probe`` rounds."""
        self._ending = None
        if rows == 1:  # a lone sequence: its drafter's own budget already weighs each tree against plain decoding
            return True
        if self._probe is not None:
            b, mode, left = self._probe
            self._probe = (b, mode, left - 1) if left > 1 else None
            self._ending = (b, mode) if left == 1 else None
            return mode
        b = bucket(rows)
        best = self._best(b)
        if (b, best) not in self.rate:
            return best
        self.since[b] = self.since.get(b, 0) + 1
        if self.since[b] >= self.wait.get((b, not best), self.probe):
            self.since[b] = 0
            self._probe = (b, not best, self.probe_rounds - 1) if self.probe_rounds > 1 else None
            self._ending = (b, not best) if self.probe_rounds == 1 else None
            return not best
        return best

    def record(self, rows: int, drafted: bool, tokens: int, seconds: float, measured: bool = True) -> None:
        """After a round: its tokens and seconds. ``measured=False``: the round paid for something else (a
        newcomer's first round in the batch) and does not count, but still moves the probe along."""
        switched, self._last = drafted != self._last, drafted
        key = (bucket(rows), drafted)
        if measured and seconds > 0 and not (switched and self.probe_rounds > 1):
            # decayed sums of tokens and of seconds: their ratio, not a mean of per-round ratios (fast rounds of
            # a few tokens would weigh as much as slow rounds of many)
            t, sec = self._sums.get(key, (0.0, 0.0))
            t, sec = self.decay * t + tokens, self.decay * sec + seconds
            self._sums[key] = (t, sec)
            self.rate[key] = t / sec
        if self._ending is not None:  # the probe is over: did the probed mode lose?
            b, mode = self._ending
            mine, other = self.rate.get((b, mode)), self.rate.get((b, not mode))
            if mine is not None and other is not None and mine < other:
                self.wait[(b, mode)] = min(self.max_probe, self.growth * self.wait.get((b, mode), self.probe))
            else:
                self.wait[(b, mode)] = self.probe
            self._ending = None

    def summary(self) -> dict:
        return {f"{b}:{'draft' if d else 'plain'}": round(r, 2) for (b, d), r in sorted(self.rate.items())}


class AlwaysDraft(DraftOrPlain):
    """Every round drafts: each row's drafter and budget alone decide its tree (the default; see above)."""

    def choose(self, rows: int) -> bool:
        return True

    def record(self, rows: int, drafted: bool, tokens: int, seconds: float, measured: bool = True) -> None:
        pass
