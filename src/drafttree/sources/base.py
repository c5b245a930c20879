"""The candidate-source protocol and the online calibration every source's scores go through.

A source proposes :class:`~drafttree.tree.Candidates` (tokens, parents, per-node log-probability of being
accepted given the parent was) plus, per node, the calibration *cell* its estimate came from. After the
target verifies the merged tree, every verified node whose parent was accepted is an observation of its
cell (accepted or not), so the estimates follow what this target actually accepts, per source and depth.
Everything here counts; nothing reads a clock, so estimates do not sway with the machine's load.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from drafttree.accept import Sampling
from drafttree.tree import Candidates

if TYPE_CHECKING:
    from drafttree.noise import Noise


class Calibration:
    """Acceptance rate per cell: observed hits / trials, shrunk towards a prior with ``strength`` pseudo-trials."""

    def __init__(self, prior: torch.Tensor, strength: float = 4.0, floor: float = 1e-3, levels: int = 0):
        self.prior = prior.double().clamp(floor, 1 - floor)
        self.strength, self.floor = float(strength), float(floor)
        self.default = (self.prior.clone(), self.strength)  # before any fitted prior was applied
        self.hits = torch.zeros_like(self.prior)
        self.trials = torch.zeros_like(self.prior)
        # per depth level (sources that expand level by level): accepted nodes, and accepted parents whose children
        # were put to the test, so level_hits / level_tests = P(some child of an accepted node is accepted)
        self.level_hits = [0.0] * levels
        self.level_tests = [0.0] * levels

    def _tables(self) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
        """Every cell's rate (float32), its log and the rates as floats, rebuilt only when the counts, the prior or
        the shrinkage changed (tensor versions count in-place writes): sources look up a few cells several times a
        round, and a dozen small tensor ops per lookup cost more than the round's arithmetic."""
        tensors = (self.prior, self.hits, self.trials)
        # inference tensors (made under torch.inference_mode) keep no version: those tables are built every time
        key = None if any(t.is_inference() for t in tensors) else (*(t._version for t in tensors), self.strength,
                                                                    self.floor)
        cached = self.__dict__.get("_cached")
        if (key is None or cached is None or cached[1] != key or cached[0][0] is not self.prior
                or cached[0][1] is not self.hits or cached[0][2] is not self.trials):
            r = ((self.hits + self.strength * self.prior) / (self.trials + self.strength)).clamp(self.floor, 1.0)
            rate = r.float()
            cached = (tensors, key, rate, rate.log(), r.tolist())
            self.__dict__["_cached"] = cached
        return cached[2], cached[3], cached[4]

    def rate(self, cells: torch.Tensor) -> torch.Tensor:
        return self._tables()[0][cells.cpu()].to(cells.device)

    def rate_of(self, cell: int) -> float:
        """:meth:`rate` of one cell, as a float (no tensor ops on a hot path)."""
        return self._tables()[2][cell]

    def logp(self, cells: torch.Tensor) -> torch.Tensor:
        return self._tables()[1][cells.cpu()].to(cells.device)

    def update(self, cells: list[int], outcomes: list[bool]) -> None:
        if not cells:
            return
        c = torch.tensor(cells, dtype=torch.long)
        self.trials.index_add_(0, c, torch.ones(len(cells), dtype=torch.float64))
        self.hits.index_add_(0, c, torch.tensor(outcomes, dtype=torch.float64))

    def update_levels(self, levels: list[int], parents: list[int], outcomes: list[bool]) -> None:
        """Tested nodes by level (0-based, capped), with their parents: one test per distinct (level, parent), a hit
        when any of its children was accepted (a node the source proposed twice, as a draft LM extending another
        source's branch may, counts once)."""
        tested: dict[tuple[int, int], bool] = {}
        for lv, parent, hit in zip(levels, parents, outcomes):
            lv = min(lv, len(self.level_hits) - 1)
            if lv >= 0:
                tested[(lv, parent)] = tested.get((lv, parent), False) or bool(hit)
        for (lv, _), hit in tested.items():
            self.level_tests[lv] += 1.0
            self.level_hits[lv] += float(hit)

    def level_rate(self, level: int, strength: float = 2.0, explore: float = 0.0) -> float:
        """P(some child of an accepted node is accepted) at ``level`` (0-based), each level shrunk towards the level
        above it (the first towards 1/2): a level never drafted reads as the one above, not as a coin toss, so a
        source that stopped early is not kept shallow by the prior alone. ``explore`` > 0 adds that many standard
        errors of the level's estimate: a level seldom tested reads optimistic, so one early miss there does not
        stop a source from ever drafting it again (and learning it pays), while a well-tested level reads as it is."""
        rate, n = 0.5, strength
        for lv in range(min(level, len(self.level_hits) - 1) + 1):
            n = self.level_tests[lv] + strength
            rate = (self.level_hits[lv] + strength * rate) / n
        if explore > 0:
            rate += explore * math.sqrt(max(0.0, rate * (1.0 - rate)) / n)
        return min(1.0, rate)

    def decay(self, factor: float) -> None:
        """Weigh what was observed so far by ``factor`` (a new generation: newer evidence counts more)."""
        self.hits.mul_(factor)
        self.trials.mul_(factor)
        self.level_hits = [h * factor for h in self.level_hits]
        self.level_tests = [t * factor for t in self.level_tests]

    def reset(self) -> None:
        self.hits.zero_()
        self.trials.zero_()
        self.level_hits = [0.0] * len(self.level_hits)
        self.level_tests = [0.0] * len(self.level_tests)

    def fresh(self) -> Calibration:
        """A calibration with this one's built-in default prior and no observations."""
        return Calibration(self.default[0].clone(), self.default[1], self.floor, len(self.level_hits))


# At T > 0 the target's token at a position is argmax(warped logits + that position's Gumbel noise), and the noise is
# known before drafting (noise.py). A free source's candidate x at a position is accepted only if it wins there, and
# given its own noise g it does with probability exp(-(1 - p) / p * e^-g) (p: the target's probability of x): a
# candidate p = 0.5 wins 7% of the time at g = -1 and 87% at g = 2. With the hybrid's ``noise_cells`` (off by default:
# no gain measured, docs/benchmark-notes.md, stop 81) each free-source cell is split at T > 0 by the bin of its
# candidate's noise (:class:`NoiseCalibration`), and the tree is grown where the noise favours the guesses.
NOISE_EDGES = (-0.5, 0.5, 1.5, 2.5)  # standard Gumbel: 19%, 35%, 25%, 12%, 8% of draws
NOISE_BINS = len(NOISE_EDGES) + 1


def _gumbel_bin_means(p: torch.Tensor, spread: float = 0.0) -> torch.Tensor:
    """[len(p), NOISE_BINS]: E[exp(-(1 - q) / q * e^-g) | g in bin] under a standard Gumbel g (quadrature on a fine
    grid), for q = p, or with ``spread`` > 0 for q ~ Beta(spread * p, spread * (1 - p)) (a cell pools candidates the
    target likes very differently). Weighted by the bins' probabilities a row averages to p (e^-g is exponential:
    E[exp(-kX)] = 1/(1+k) = q)."""
    g = torch.linspace(-4.0, 14.0, 9001, dtype=torch.float64)
    density = torch.exp(-g - torch.exp(-g))
    bins = torch.bucketize(g, torch.tensor(NOISE_EDGES, dtype=torch.float64), right=True)
    p = p.double()
    if spread > 0:  # q on a logit grid (q = sigmoid(t): the density's mass near 0 and 1 is resolved), Beta-weighted
        t = torch.linspace(-30.0, 30.0, 1201, dtype=torch.float64)
        q = torch.sigmoid(t)
        a, b = (spread * p)[:, None], (spread * (1 - p))[:, None]
        logw = a * torch.nn.functional.logsigmoid(t)[None, :] + b * torch.nn.functional.logsigmoid(-t)[None, :]
        w = torch.exp(logw - logw.max(1, keepdim=True).values)
        w = w / w.sum(1, keepdim=True)  # [P, Q]
    else:
        q, w = p, None
    k = (1 - q) / q
    win = torch.exp(-k[:, None] * torch.exp(-g)[None, :]) * density[None, :]  # [Q, G]
    out = torch.zeros(p.numel(), NOISE_BINS, dtype=torch.float64)
    for bn in range(NOISE_BINS):
        sel = bins == bn
        per_q = win[:, sel].sum(1) / density[sel].sum()
        out[:, bn] = per_q if w is None else w @ per_q
    return out


# a cell's candidates are not all alike: its rate is read as the mean of Beta(2p, 2(1 - p)) (a prior: what the
# target then accepts, per cell and bin, takes over after a few observations)
PRIOR_SPREAD = 2.0


def noise_prior(base: torch.Tensor, floor: float = 1e-3) -> torch.Tensor:
    """A cell layout's prior (acceptance rates) split by noise bin: cell c, bin b at c * NOISE_BINS + b."""
    p = base.double().clamp(floor, 1 - floor)
    return _gumbel_bin_means(p, PRIOR_SPREAD).clamp(floor, 1 - floor).reshape(-1)


class NoiseCalibration(Calibration):
    """A free source's calibration at T > 0: its cells x the bins of the candidate's noise (see NOISE_EDGES), the
    prior each cell's rate split as Gumbel-max predicts; fitted priors of the plain layout are split the same way."""

    def __init__(self, base_prior: torch.Tensor, strength: float = 4.0, floor: float = 1e-3):
        super().__init__(noise_prior(base_prior, floor), strength, floor)
        self.base_cells = int(base_prior.numel())
        self.base_default = base_prior.double().clone()

    def fresh(self) -> NoiseCalibration:
        return NoiseCalibration(self.base_default.clone(), self.default[1], self.floor)

    def set_base_prior(self, base: torch.Tensor, strength: float) -> None:
        """Start from ``base`` (rates of the plain layout, e.g. fitted ones) split by noise bin."""
        self.prior = noise_prior(base, self.floor)
        self.strength = float(strength)


MEDIAN_BIN = bisect.bisect_right(NOISE_EDGES, -math.log(math.log(2.0)))  # the bin of the Gumbel median, 0.367


def noise_cells(calibration: Calibration, cells: list[int], tokens: list[int], depths: list[int], rc) -> list[int]:
    """A free source's cells as its current calibration reads them: split by each candidate's noise bin where that is
    a :class:`NoiseCalibration` (the sampled one), else as they are."""
    if not isinstance(calibration, NoiseCalibration):
        return cells
    if rc.noise is None or rc.sampling is None or rc.sampling.greedy:  # not sampling: the Gumbel median's bin
        return [c * NOISE_BINS + MEDIAN_BIN for c in cells]
    rows: dict[int, object] = {}
    out = []
    for c, t, d in zip(cells, tokens, depths):  # a node at depth d is the token sampled at root_pos + d
        g = rows.get(d)
        if g is None:
            g = rows[d] = rc.noise.at(rc.root_pos + d).numpy()
        out.append(c * NOISE_BINS + bisect.bisect_right(NOISE_EDGES, float(g[t]) if t < len(g) else 0.0))
    return out


@dataclass
class Proposal:
    """One source's candidates for this round, with the calibration cell of every node."""

    source: int  # index of the source in the drafter
    cands: Candidates
    cells: torch.Tensor  # [m] long
    spent: float | None = None  # drafting cost in target forwards, when the source knows it (else levels x cost)
    # of ``spent``, what encoding the pairs committed while the source was not drafting cost beyond one round's: paid
    # once after a closed gate, so gates weigh a round without it (else a probe after a long wait fails on its own
    # backlog and keeps the gate closed); ``catch_up_seconds`` is the clock's part of it
    catch_up: float = 0.0
    catch_up_seconds: float = 0.0

    @property
    def expected(self) -> float:
        """Expected accepted drafts if every candidate were verified (an upper bound per source)."""
        return float(self.cands.score.exp().sum()) if self.cands.tokens.numel() else 0.0


class Trie:
    """Continuations merged from the root: per node its token, parent (parents before children), depth, the total
    weight of the continuations through it (how many agree) and the largest ``tag`` among them (e.g. match length)."""

    def __init__(self):
        self.child: dict[tuple[int, int], int] = {}
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.weights: list[int] = []
        self.tags: list[int] = []

    def add(self, seq, weight: int = 1, tag: int = 0) -> None:
        node = -1
        for d, tok in enumerate(seq):
            i = self.child.get((node, tok))
            if i is None:
                i = self.child[(node, tok)] = len(self.tokens)
                self.tokens.append(tok)
                self.parents.append(node)
                self.depths.append(d + 1)
                self.weights.append(0)
                self.tags.append(tag)
            self.weights[i] += weight
            self.tags[i] = max(self.tags[i], tag)
            node = i


def trie_proposal(index: int, tokens: list[int], parents: list[int], cells: torch.Tensor,
                  calibration: Calibration) -> Proposal:
    """A source's trie (parents before children) as a proposal: each node's conditional acceptance from its cell,
    its score the sum along its path (host floats: no per-node tensor ops)."""
    cond = calibration.logp(cells)
    score = cond.tolist()
    for i, q in enumerate(parents):
        if q >= 0:
            score[i] += score[q]
    cands = Candidates(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), cond,
                       torch.tensor(score, dtype=cond.dtype), cond.clone())
    return Proposal(index, cands, cells)


@dataclass
class RoundContext:
    """What a source sees each round besides the request: what earlier (cheaper) sources proposed."""

    context: list[int]
    root: int
    max_depth: int
    sampling: Sampling
    earlier: list[Proposal]
    # no tree whose best first node is estimated below this can pay this round (a batch's bar); 0: no bar
    min_accept: float = 0.0
    noise: Noise | None = None  # the generation's noise: model sources draft through it at T > 0
    target: object | None = None  # the request's target (DraftRequest.target)

    @property
    def root_pos(self) -> int:
        """The root's sequence position (``context`` ends with the root)."""
        return len(self.context) - 1


class CandidateSource(Protocol):
    """Proposes scored branches from the root; learns from the committed tokens.

    ``cost`` is the drafting cost of one expansion level in target forwards (0 for free sources such as
    n-grams); ``calibration`` maps the source's cells to acceptance rates and is updated by the drafter.
    """

    name: str
    cost: float
    calibration: Calibration

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None: ...

    def propose(self, rc: RoundContext, index: int) -> Proposal | None: ...

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None: ...
