"""A drafting source for the hybrid drafter's tests (test_hybrid.py, test_hybrid_gates.py): a fixed chain at a fixed
prior."""

from __future__ import annotations

import torch

from drafttree.sources.base import Calibration, Proposal
from drafttree.tree import Candidates


class ConstantSource:
    """A test source: always proposes the same chain, costs ``cost`` forwards a level."""

    name = "const"

    def __init__(self, chain, cost=0.0, prior=0.9):
        self.chain, self.cost = chain, cost
        self.calibration = Calibration(torch.full((1,), prior))

    def begin(self, *a):
        pass

    def observe(self, *a):
        pass

    def propose(self, rc, index):
        cells = torch.zeros(len(self.chain), dtype=torch.long)
        cond = self.calibration.logp(cells)
        score = torch.cumsum(cond, 0)
        par = torch.arange(len(self.chain)) - 1
        return Proposal(index, Candidates(torch.tensor(self.chain), par, cond, score, cond.clone(), 0), cells)
