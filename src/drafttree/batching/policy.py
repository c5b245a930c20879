"""Whether a batched round drafts at all.

The default, :class:`DraftWhilePays`, lets rounds draft while their accepted drafts pay for all that drafting adds
to a round (the Python of every row's drafter, the packing, the drafted tokens' share of the forward), judged from
the drafting rounds themselves; a closed batch size probes now and then. Until stop 65 the default was
:class:`AlwaysDraft`, which leaves it to each row: every row's drafter sizes its own tree on its
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

TAIL = "|tail"  # the key suffix of rounds judged by the row with the most tokens left (DraftWhilePays)


def bucket(rows: int) -> int:
    """1, 2, 4, 8, ...: batch sizes within a factor of two share what was measured."""
    return 1 << (max(1, rows).bit_length() - 1)


def nearest(b: int, known) -> int | None:
    """Of the measured buckets ``known``, the one nearest bucket ``b`` in factors of two (the larger of two as near)."""
    return min(known, key=lambda k: (abs(k.bit_length() - b.bit_length()), -k), default=None)


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
        return nearest(b, {k for (k, _) in self.rate if (k, True) in self.rate and (k, False) in self.rate})

    def _best(self, b: int) -> bool:
        if (b, True) in self.rate and (b, False) in self.rate:
            return self.rate[(b, True)] >= self.rate[(b, False)]
        near = self._nearest(b)
        return self.rate[(near, True)] >= self.rate[(near, False)] if near is not None else b == 1

    def choose(self, rows: int, kind: str = "", tail: bool = False) -> bool:
        """True: this round drafts (``kind``: the rows' mix of drafters; ``tail``: see :class:`DraftWhilePays`; both
        unused here). An unmeasured size starts in the mode that won at the nearest measured size (with nothing
        measured: drafting alone, plain in a batch) and probes the other after ``probe`` rounds."""
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

    def record(self, rows: int, drafted: bool, tokens: int, seconds: float, measured: bool = True,
               drafting: float = 0.0, extra_verify: float = 0.0, kind: str = "",
               tail_drafts: float | None = None, row_seconds: float = 0.0) -> None:
        """After a round: its tokens and seconds (``drafting``, ``extra_verify``: see :class:`DraftWhilePays`).
        ``measured=False``: the round paid for something else (a newcomer's first round in the batch) and does not
        count, but still moves the probe along."""
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
    """Every round drafts: each row's drafter and budget alone decide its tree (the default until stop 65)."""

    def choose(self, rows: int, kind: str = "", tail: bool = False) -> bool:
        return True

    def record(self, rows: int, drafted: bool, tokens: int, seconds: float, measured: bool = True,
               drafting: float = 0.0, extra_verify: float = 0.0, kind: str = "",
               tail_drafts: float | None = None, row_seconds: float = 0.0) -> None:
        pass


class DraftWhilePays(AlwaysDraft):
    """Rounds draft while the drafts pay for everything they add to the round, per batch-size bucket (the default).

    Each row's drafter weighs its own tree (its budget, its batch gate), but a drafting round also pays for what no
    row is charged: the rows whose gates are closed asking anyway, the batch's packing, masks and acceptance over
    bigger trees (at 16 rows here ~2 ms of a ~35 ms round, against ~1 accepted draft a round). A drafting round tells
    its whole cost without a plain round to compare with: ``drafting`` (the seconds spent proposing and packing),
    ``extra_verify`` (the forward's modelled cost of the drafted tokens beyond the roots) and the rest of the round,
    which a plain round would also have taken. Drafting pays while the accepted drafts per row beat what the plain
    rounds would have made in that time: Σ(tokens - rows) / Σrows > Σ(drafting + extra_verify) / Σrest, over slowly
    decayed sums (accepted drafts come in bursts, a copied passage and then nothing: means over a few rounds closed
    the rounds on drafts that paid over a load). A bucket starts from a prior worth ``prior_rounds`` rounds that pays
    twice over, so a slow start does not close it; a closed bucket probes ``probe_rounds`` drafting rounds after
    ``probe`` plain ones, the wait doubling after each probe that does not pay (up to ``max_probe``). State is kept
    per mix of drafters (``kind``): rows of ``ar`` never pay for drafting and must not close rounds for ``auto``.
    Comparing whole rounds' rates (:class:`DraftOrPlain`) misled on this CPU; here the forward's share is the curve's
    and only the small, steady Python time is measured.

    ``tail``: nobody waits for a row, so the batch lasts as long as its row with the most tokens left and every
    drafting round delays that row. Its accepted drafts (``tail_drafts``, the fewest among rows tied for the most
    tokens left) each save the batch a whole round; another row's save only what that row adds to each round until
    it ends (``row_seconds``, the curve's step at the batch's size and the row's measured excess): little where a
    forward streams weights (4 rows here), nearly a row's share where it is arithmetic-bound (64). Such rounds are
    judged by that worth in sums of their own. Judged by all rows, bursts of 4 users on a Zen 3 drafted for the rows
    that finished first and ended 5% behind batched ``ar`` (docs/benchmark-notes.md, stop 70)."""

    def __init__(self, probe: int = 16, max_probe: int = 128, decay: float = 0.99, probe_rounds: int = 4,
                 prior_rounds: float = 8.0):
        super().__init__()
        self.probe, self.max_probe, self.decay, self.probe_rounds = probe, max_probe, decay, max(1, probe_rounds)
        self.prior_rounds = prior_rounds
        # (bucket, kind) -> decayed [accepted drafts, rows, cost seconds, rest seconds]
        self.sums: dict[tuple[int, str], list[float]] = {}
        self.wait: dict[tuple[int, str], int] = {}
        self.since: dict[tuple[int, str], int] = {}
        self.probing: dict[tuple[int, str], int] = {}  # drafting rounds left in the key's probe
        self._rounds = {"draft": 0, "plain": 0}

    def pays(self, key: tuple[int, str]) -> bool:
        s = self.sums.get(key) or self._nearest_sums(key)  # a new size: as the nearest size measured
        return s is None or s[0] * s[3] > s[2] * s[1]  # nothing measured yet: draft, and measure

    def _nearest_sums(self, key: tuple[int, str]) -> list[float] | None:
        """The sums of the measured batch size nearest ``key``'s with the same mix of drafters, or None."""
        b, kind = key
        near = nearest(b, [k for (k, m) in self.sums if m == kind and k != b])
        return None if near is None else self.sums[(near, kind)]

    def choose(self, rows: int, kind: str = "", tail: bool = False) -> bool:
        key = (bucket(rows), kind + TAIL if tail else kind)
        if rows == 1:
            drafting = True
        elif self.probing.get(key, 0) > 0:
            self.probing[key] -= 1
            drafting = True
        elif self.pays(key):
            self.wait[key] = self.probe
            self.probing.pop(key, None)
            drafting = True
        else:
            if key in self.probing:  # a probe ended and did not pay: wait longer for the next
                del self.probing[key]
                self.wait[key] = min(self.max_probe, 2 * self.wait.get(key, self.probe))
            self.since[key] = self.since.get(key, 0) + 1
            drafting = self.since[key] >= self.wait.get(key, self.probe)
            if drafting:
                self.since[key] = 0
                self.probing[key] = self.probe_rounds - 1  # this round and the next ones
        self._rounds["draft" if drafting else "plain"] += 1
        return drafting

    def record(self, rows: int, drafted: bool, tokens: int, seconds: float, measured: bool = True,
               drafting: float = 0.0, extra_verify: float = 0.0, kind: str = "",
               tail_drafts: float | None = None, row_seconds: float = 0.0) -> None:
        if rows < 2 or not drafted or not measured:
            return
        cost = drafting + extra_verify
        rest = seconds - cost  # what the round would have taken without drafts
        if rest <= 0:
            return
        self._add((bucket(rows), kind), rows, float(tokens - rows), cost, rest)
        if tail_drafts is not None:  # in drafts worth a row's share of the round each, as the all-rows sums count
            others = max(0.0, tokens - rows - tail_drafts)
            self._add((bucket(rows), kind + TAIL), rows,
                      tail_drafts * rows + others * min(1.0, row_seconds * rows / rest), cost, rest)

    def _add(self, key: tuple[int, str], rows: int, drafts: float, cost: float, rest: float) -> None:
        """One drafting round into ``key``'s decayed sums: ``drafts`` accepted over the rows' roots."""
        s = self.sums.get(key)
        if s is None:  # the prior: this round's costs, with the accepted drafts per row of the nearest batch size
            # measured for this mix (a burst's rows leave and the batch walks down the sizes: each size starting over
            # from an optimistic prior drafted half of a burst of 64's rounds), or, with none, drafts paying twice over
            k, near = self.prior_rounds, self._nearest_sums(key)
            per_row = near[0] / near[1] if near is not None else 2.0 * cost / rest
            s = self.sums[key] = [per_row * rows * k, rows * k, cost * k, rest * k]
        d = self.decay
        for i, v in enumerate((drafts, float(rows), cost, rest)):
            s[i] = d * s[i] + v

    def summary(self) -> dict:
        out = {f"{b}{':' + k if k else ''}:pays": self.pays((b, k)) for b, k in sorted(self.sums)}
        return {**out, **self._rounds}
