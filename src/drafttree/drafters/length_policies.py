"""Draft-length policies (AdaEAGLE and confidence thresholds): one small class each.

A policy decides, before a round, how deep the drafter may go and, for chains, when to stop early. It sees
the last token the target validated and that token's target feature (what the LDLP predicts from).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from drafttree.drafters.base import DraftRequest

StopRule = Callable[[list[int], float], bool]  # (tokens drafted so far, cumulative log-prob) -> stop?
LastToken = tuple[int, torch.Tensor]  # (token id, its target feature)


class LengthPolicy(Protocol):
    def plan(self, req: DraftRequest, last: LastToken, chain: bool) -> tuple[int, StopRule | None]:
        """(depth for this round, early-stop rule or None)."""


class FixedLength:
    """Always draft ``depth`` levels."""

    def __init__(self, depth: int):
        self.depth = int(depth)

    def plan(self, req, last, chain):
        return self.depth, None


class ConfidenceStop:
    """Stop a chain once its cumulative draft log-probability falls below ``threshold``."""

    def __init__(self, depth: int, threshold: float):
        self.depth, self.threshold = int(depth), float(threshold)

    def plan(self, req, last, chain):
        return self.depth, (lambda toks, cum: cum < self.threshold) if chain else None


class LengthPredictor:
    """The AdaEAGLE LDLP: predicts the chain length from the last validated token's embedding and feature."""

    def __init__(self, head, ldlp):
        self.head, self.ldlp = head, ldlp

    def __call__(self, last: LastToken) -> int:
        tok, feat = last
        emb = self.head.embed_tokens(torch.tensor(tok, device=self.head.fc.weight.device))
        return self.ldlp.predict(emb.float(), feat.float())


class PredictedLength:
    """Chains draft the predicted length; trees go ``slack`` levels deeper (eagle2-ldlp)."""

    def __init__(self, predict: LengthPredictor, slack: int = 1):
        self.predict, self.slack = predict, int(slack)

    def plan(self, req, last, chain):
        k = self.predict(last)
        req.info["predicted_length"] = k
        return (k if chain else max(1, k + self.slack)), None


class PredictedLengthAndConfidence:
    """AdaEAGLE-DDD for chains: stop only when both the LDLP and the confidence threshold say stop."""

    def __init__(self, predict: LengthPredictor, depth: int, threshold: float, slack: int = 1):
        self.predict, self.depth, self.threshold, self.slack = predict, int(depth), float(threshold), int(slack)

    def plan(self, req, last, chain):
        k = self.predict(last)
        req.info["predicted_length"] = k
        if not chain:
            return max(1, k + self.slack), None
        return self.depth, (lambda toks, cum: len(toks) >= k and cum < self.threshold)
