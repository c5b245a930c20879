"""The verify-cost curve corrected online by the verify forwards that decoding actually runs.

The cached curve (budget.py) is the fastest of a few timings taken once, in whatever state the machine was in then.
On a shared CPU that state moves: stop 53 found a curve cached with a 12.6 ms one-token forward while decoding ran
them in ~10.6 ms and its 8-token trees in ~1.8 of those, not the 1.3 cached, so trees that could not pay were verified
(`auto` below `ar` at T=1 on long contexts). Each lone round's verify time corrects the curve point of its size: a
mean of log(measured / cached) per point (running at first, then decayed; each forward's ratio clipped to [1/2, 2]), and
the corrected curve is rebuilt every few rounds. A point no round has reached takes the correction of the nearest
smaller point that has one, or none: where only big trees were timed and found dear, the small sizes keep their cached
cost, trees shrink, and those sizes get timed in turn. Only tree sizes and drafting decisions read the curve: the
output never does (noise.py), so a seeded generation stays reproducible.
"""

from __future__ import annotations

import bisect
import math

from drafttree.budget import CostModel

MIN_SEEN = 3  # observations before a point's correction is used


class LiveCurve:
    """A cached :class:`CostModel` and its online correction (``curve``: the one to size trees by)."""

    def __init__(self, cached: CostModel, decay: float = 0.95, every: int = 8, clip: float = 0.7):
        self.cached, self.decay, self.every, self.clip = cached, decay, every, clip
        self.curve = cached
        self.log_ratio = [0.0] * len(cached.sizes)
        self.seen = [0] * len(cached.sizes)
        self._since = 0

    def observe(self, tokens: int, context: int, seconds: float) -> bool:
        """A verify forward of ``tokens`` tokens after ``context`` tokens took ``seconds``; True when it rebuilt
        ``curve``. Its log ratio is clipped to +-``clip`` (a stall must not swing a tree)."""
        if tokens < 1 or not seconds > 0:
            return False
        predicted = self.cached.at(context).verify(tokens)
        r = max(-self.clip, min(self.clip, math.log(seconds / predicted)))
        i = max(0, bisect.bisect_right(self.cached.sizes, tokens) - 1)
        self.seen[i] += 1
        w = max(1.0 - self.decay, 1.0 / self.seen[i])
        self.log_ratio[i] += w * (r - self.log_ratio[i])
        self._since += 1
        if self._since < self.every:
            return False
        self._since = 0
        self.curve = self.corrected()
        return True

    def ratios(self) -> list[float | None]:
        """measured / cached per curve point, None where too few forwards of its sizes were seen."""
        return [math.exp(r) if n >= MIN_SEEN else None for r, n in zip(self.log_ratio, self.seen)]

    def corrected(self) -> CostModel:
        known = [i for i, n in enumerate(self.seen) if n >= MIN_SEEN]
        if not known:
            return self.cached
        secs = []
        for i, s in enumerate(self.cached.seconds):
            below = [j for j in known if j <= i]
            secs.append(s * math.exp(self.log_ratio[below[-1]]) if below else s)
        for i in range(1, len(secs)):  # a bigger forward never costs less
            secs[i] = max(secs[i], secs[i - 1])
        return CostModel(list(self.cached.sizes), secs, self.cached.context, self.cached.per_key)
