"""Whether a batched round drafts at all: measured, per batch size, against plain batched decoding.

A verify-cost curve measured on one sequence does not say what a forward over several rows costs (each row
reads its own past, masks grow with the batch), and drafting runs once per row. So the batch keeps, per
batch-size bucket, the measured tokens per second of rounds with drafts and of plain rounds (every row
verifies its root only), uses the better and probes the other now and then (the wait growing after a failed
probe). The default therefore never settles below batched plain decoding. A lone sequence drafts as it would
alone (its budget already falls back to the root when a tree does not pay for its verification; timing single
rounds of one row only adds noise to that). Seeded rows ignore it (their trees must not depend on the clock)
and draft as they would alone.
"""

from __future__ import annotations


def bucket(rows: int) -> int:
    """1, 2, 4, 8, ...: batch sizes within a factor of two share what was measured."""
    return 1 << (max(1, rows).bit_length() - 1)


class DraftOrPlain:
    def __init__(self, probe: int = 8, max_probe: int = 256, decay: float = 0.7, growth: int = 4):
        self.probe, self.max_probe, self.decay, self.growth = probe, max_probe, decay, growth
        self.rate: dict[tuple[int, bool], float] = {}  # (bucket, drafted) -> tokens per second (EMA)
        self.wait: dict[tuple[int, bool], int] = {}
        self.since: dict[int, int] = {}

    def _nearest(self, b: int) -> int | None:
        """The measured batch size closest to ``b`` (in factors of two), for a size not measured yet."""
        known = {k for (k, _) in self.rate if (k, True) in self.rate and (k, False) in self.rate}
        return min(known, key=lambda k: (abs(k.bit_length() - b.bit_length()), -k)) if known else None

    def choose(self, rows: int) -> bool:
        """True: this round drafts. An unmeasured size starts in the mode that won at the nearest measured size
        (with nothing measured: drafting alone, plain in a batch) and probes the other after ``probe`` rounds."""
        b = bucket(rows)
        if rows == 1:  # a lone sequence: its drafter's own budget already weighs each tree against plain decoding
            return True
        if (b, True) in self.rate and (b, False) in self.rate:
            best = self.rate[(b, True)] >= self.rate[(b, False)]
            wait = self.wait.get((b, not best), self.probe)
        else:
            near = self._nearest(b)
            best = self.rate[(near, True)] >= self.rate[(near, False)] if near is not None else b == 1
            if (b, best) not in self.rate:
                return best
            wait = self.probe
        self.since[b] = self.since.get(b, 0) + 1
        if self.since[b] >= wait:
            self.since[b] = 0
            return not best  # probe the other mode once
        return best

    def record(self, rows: int, drafted: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        b, key = bucket(rows), (bucket(rows), drafted)
        rate = tokens / seconds
        was_best = key in self.rate and (b, not drafted) in self.rate and \
            self.rate[key] >= self.rate[(b, not drafted)]
        self.rate[key] = rate if key not in self.rate else self.decay * self.rate[key] + (1 - self.decay) * rate
        other = (b, not drafted)
        if other in self.rate and self.rate[key] < self.rate[other] and not was_best:
            self.wait[key] = min(self.max_probe, self.growth * self.wait.get(key, self.probe))  # a failed probe
        elif other in self.rate and self.rate[key] >= self.rate[other]:
            self.wait[key] = self.probe

    def summary(self) -> dict:
        return {f"{b}:{'draft' if d else 'plain'}": round(r, 2) for (b, d), r in sorted(self.rate.items())}


class AlwaysDraft(DraftOrPlain):
    """Every round drafts (each row's drafter and budget alone decide its tree): for tests and comparisons."""

    def choose(self, rows: int) -> bool:
        return True

    def record(self, rows: int, drafted: bool, tokens: int, seconds: float) -> None:
        pass
