"""Acceptance rules: the only place where losslessness lives.

Every rule returns the accepted root-to-node path of a verified :class:`~drafttree.tree.DraftTree` and
the next token (the target's correction, or its bonus token when the whole path was accepted).

Why the sampling rule is lossless. At a node, let r be the target distribution (after temperature, top-k
and top-p). The node's children are tried in order; child i carries a token x_i drawn from a proposal
distribution q_i *independently of every earlier accept/reject decision* (a deterministic top-k or lookup
candidate is the point mass q_i = delta(x_i); a sampled draft token keeps its q_i). Child i is accepted
with probability min(1, r(x_i) / q_i(x_i)); on rejection r becomes norm(max(0, r - q_i)) and the next
child is tried; when all are rejected the token is sampled from the final r. For one child,
P(out = y) = min(q_i(y), r(y)) + P(reject) * max(0, r(y) - q_i(y)) / P(reject) = r(y), with
P(reject) = sum_y max(0, r(y) - q_i(y)); by induction over the siblings the emitted token is distributed
exactly as r, the target's distribution. An accepted child's subtree was drafted given that child, so
the walk repeats at the child with the target's distribution there: the whole sequence is sampled from
the target (Leviathan et al. 2023, Chen et al. 2023; for point masses this is EAGLE-2's rule: accept x
with probability r(x), otherwise zero r(x) and renormalise).

At temperature 0 the target is deterministic (argmax) and the rule reduces to following the child whose
token equals the argmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from drafttree.categorical import draw
from drafttree.errors import DraftTreeError
from drafttree.tree import DraftTree


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if self.temperature is None or self.temperature < 0:
            raise DraftTreeError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise DraftTreeError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is None or self.top_k < 0:
            raise DraftTreeError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Target sampling distribution from logits: temperature, then top-k, then top-p (nucleus), float32."""
    logits = logits.float()
    if sampling.greedy:
        out = torch.zeros_like(logits)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        probs = nucleus(probs, sampling.top_p)
    return probs


def nucleus(probs: torch.Tensor, top_p: float, first: int = 64) -> torch.Tensor:
    """Keep the smallest prefix of tokens by falling probability whose mass reaches ``top_p`` (the token that
    crosses it stays), renormalised. A full sort of 49k probabilities costs ~3 ms on a CPU, so the prefix is
    looked for among the ``first`` likeliest tokens, and failing that among the tokens above a threshold whose
    tokens hold at least ``top_p`` of the mass (so the crossing token is one of them): (1 - top_p) / V always is."""
    if probs.dim() > 1:
        return torch.stack([nucleus(row, top_p, first) for row in probs.reshape(-1, probs.shape[-1])]).reshape(
            probs.shape)
    vocab = probs.shape[-1]
    sorted_p, order = probs.topk(min(first, vocab))
    if float(sorted_p.sum()) < top_p:
        # a threshold whose tokens hold >= top_p of the mass, tightened by bisection (log scale) towards the
        # 64th largest probability, so that few tokens are sorted
        lo, hi = math.log((1.0 - top_p) / vocab), math.log(max(float(sorted_p[-1]), 1e-38))
        for _ in range(10):
            mid = (lo + hi) / 2
            if float(torch.where(probs >= math.exp(mid), probs, 0.0).sum()) >= top_p:
                lo = mid
            else:
                hi = mid
        idx = (probs >= math.exp(lo)).nonzero().squeeze(1)
        sorted_p, pos = probs[idx].sort(descending=True)
        order = idx[pos]
    keep_sorted = (sorted_p.cumsum(0) - sorted_p) < top_p  # the prefix up to and including the crossing token
    out = torch.zeros_like(probs)
    kept = order[keep_sorted]
    out[kept] = probs[kept]
    return out / out.sum()


def sample_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """Plain autoregressive sampling of one token from the target's logits."""
    if sampling.greedy:
        return int(logits.argmax(-1).item())
    return draw(warp_probs(logits, sampling), generator)


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Longest root-to-node path whose every token equals the target's argmax at its parent."""
    best = logits.argmax(-1)  # [n]
    if tree.size == 1:
        return [0], int(best[0].item())
    match = torch.ones(tree.size, dtype=torch.bool, device=best.device)
    match[1:] = tree.tokens[1:] == best[tree.parents[1:]]
    ok = ~(tree.ancestors & ~match[None, :]).any(1)  # every node on the path matches
    depth = torch.where(ok, tree.depths, torch.full_like(tree.depths, -1))
    node = int(depth.argmax().item())  # deepest accepted node (first one on ties)
    return tree.path_to(node), int(best[node].item())


def accept_sampling(
    tree: DraftTree, logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None,
    _broken: bool = False,
) -> tuple[list[int], int]:
    """Multi-candidate speculative sampling over the tree (see the module docstring for the proof).

    ``_broken`` exists only for tests: it accepts every draft with probability r(x) / q(x) *without* the
    residual renormalisation, a plausible-looking but wrong rule that the distribution tests must catch.
    """
    children = tree.children()
    tokens = tree.tokens.tolist()
    sampled = tree.sampled.tolist() if tree.sampled is not None else [False] * tree.size
    node, path = 0, [0]
    while True:
        r = warp_probs(logits[node], sampling)
        accepted = None
        for c in children[node]:
            x = tokens[c]
            rx = float(r[x])
            if sampled[c]:
                q = tree.draft_probs[c].to(r.device, torch.float32)
                qx = float(q[x])
            else:
                q, qx = None, 1.0
            u = float(torch.rand((), generator=generator, device=r.device))
            if qx > 0 and u < min(1.0, rx / qx):
                accepted = c
                break
            if _broken:
                continue
            if q is None:
                r[x] = 0.0
            else:
                r = torch.clamp(r - q, min=0.0)
            total = float(r.sum())
            if total <= 0.0:  # r was entirely covered by the proposals: cannot happen when rx < qx somewhere
                r = warp_probs(logits[node], sampling)
                break
            r = r / total
        if accepted is None:
            return path, draw(r, generator)
        node = accepted
        path.append(node)


def accept(tree: DraftTree, logits: torch.Tensor, sampling: Sampling,
           generator: torch.Generator | None) -> tuple[list[int], int]:
    if sampling.greedy:
        return accept_greedy(tree, logits)
    return accept_sampling(tree, logits, sampling, generator)
