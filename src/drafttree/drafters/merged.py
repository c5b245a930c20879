"""The merged tree of every source's proposals, and what agreement between sources says about a node.

A node two sources propose independently is accepted far more often than either source's own estimate says
(diagnostic on prompts written for it, ``logs/s51_agree.py``, SmolLM2 + shipped head at T=0: nodes both the context
n-grams and the corpus proposed, estimated 0.17 / 0.46 / 0.76 by the better of the two, were accepted 45% / 66% /
95% of the time; a node the n-grams proposed alone, estimated 0.54, 36%). Counting agreed nodes in each source's own
cells thus inflates every source's estimate for the nodes it proposes alone. So :class:`Agreement` learns, per set
of agreeing sources and bin of the best single estimate, how often agreed nodes are accepted (shrunk towards that
estimate), and the sources' own cells learn from the nodes they alone proposed.
"""

from __future__ import annotations

import math

from drafttree.sources.base import Proposal

BINS = 10  # of the best single estimate, 0.0-0.1, ..., 0.9-1.0


class Agreement:
    """Acceptance of nodes that two or more sources proposed: hits and trials per (sources' bitmask, bin of the best
    single estimate), read as (hits + strength x estimate) / (trials + strength): with no evidence, the estimate."""

    def __init__(self, sources: int, strength: float = 4.0, floor: float = 1e-3):
        self.cells = (1 << sources) * BINS
        self.strength, self.floor = float(strength), float(floor)
        self.hits = [0.0] * self.cells
        self.trials = [0.0] * self.cells

    @staticmethod
    def cell(mask: int, estimate: float) -> int:
        return mask * BINS + min(BINS - 1, max(0, int(estimate * BINS)))

    def rate(self, cell: int, estimate: float) -> float:
        r = (self.hits[cell] + self.strength * estimate) / (self.trials[cell] + self.strength)
        return min(1.0, max(self.floor, r))

    def update(self, cell: int, hit: bool) -> None:
        self.trials[cell] += 1.0
        self.hits[cell] += float(hit)

    def decay(self, factor: float) -> None:
        self.hits = [h * factor for h in self.hits]
        self.trials = [t * factor for t in self.trials]


class MergedTree:
    """The trie of all proposals: tokens, parents, best score and the (source, cell) pairs behind each node."""

    def __init__(self, root: int):
        self.tokens, self.parents, self.scores = [root], [-1], [0.0]
        self.owners: list[list[tuple[int, int]]] = [[]]
        self.child: dict[tuple[int, int], int] = {}
        self.cond: list[float] = [0.0]  # per node, the best conditional log-estimate among its proposals
        self.agreed: list[int] = [-1]  # per node, its Agreement cell when 2+ sources proposed it (after rescore)

    def add(self, prop: Proposal, limit: int) -> None:
        """Insert the proposal's ``limit`` best candidates (no node outside them can make a top-``limit``)."""
        c = prop.cands
        m = int(c.tokens.numel())
        if m == 0:
            return
        toks, pars, scores, conds = c.tokens.tolist(), c.parents.tolist(), c.score.tolist(), c.cond_logp.tolist()
        # the best ``limit`` (ties: the earlier), in creation order; host floats (a few dozen nodes, every round)
        keep = sorted(sorted(range(m), key=lambda i: -scores[i])[:limit]) if m > limit else range(m)
        cells = prop.cells.tolist()
        where: dict[int, int] = {}
        for i in keep:
            parent = 0 if pars[i] < 0 else where[pars[i]]
            key = (parent, toks[i])
            node = self.child.get(key)
            if node is None:
                node = self.child[key] = len(self.tokens)
                self.tokens.append(toks[i])
                self.parents.append(parent)
                self.scores.append(scores[i])
                self.owners.append([])
                self.cond.append(conds[i])
                self.agreed.append(-1)
            else:
                self.scores[node] = max(self.scores[node], scores[i])
                self.cond[node] = max(self.cond[node], conds[i])
            if cells[i] >= 0:  # cell -1: a node repeated from another source's proposal, not this source's guess
                self.owners[node].append((prop.source, cells[i]))
            where[i] = node

    def rescore(self, agreement: Agreement) -> None:
        """Scores as the sum along each path of every node's conditional estimate: the best single source's, or, where
        two or more sources proposed the node, what agreement of those sources at that estimate was worth."""
        for node in range(1, len(self.tokens)):
            c = self.cond[node]
            mask = 0
            for src, _ in self.owners[node]:
                mask |= 1 << src
            if mask & (mask - 1):  # two or more sources
                est = math.exp(c)
                cell = agreement.cell(mask, est)
                self.agreed[node] = cell
                c = math.log(agreement.rate(cell, est))
            self.scores[node] = self.scores[self.parents[node]] + c

    def best_chain(self, keep: list[int]) -> list[int]:
        """Of the nodes ``keep`` (the root first, closed under parents), the chain through each node's best-rated
        child: what a target that verifies chains only is given."""
        kept, chain = set(keep), [0]
        while True:
            children = [i for i in kept if self.parents[i] == chain[-1] and i != chain[-1]]
            if not children:
                return chain
            chain.append(max(children, key=lambda i: (self.scores[i], -i)))

    def best(self, n: int) -> list[int]:
        """Indices of the root and the ``n - 1`` best nodes, in creation (topological) order."""
        order = sorted(range(1, len(self.tokens)), key=lambda i: (-self.scores[i], i))[: max(0, n - 1)]
        return [0] + sorted(order)
