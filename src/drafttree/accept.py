"""Acceptance rules: the only place where losslessness lives.

Every rule returns the accepted root-to-node path of a verified :class:`~drafttree.tree.DraftTree` and
the next token (the target's correction, or its bonus token when the whole path was accepted).

Why the sampling rule is lossless. Sampling is an argmax (:mod:`drafttree.noise`): the token the target samples at
sequence position t is argmax_x (log r(x) + g_t(x)), r the target's distribution there (after penalties and biases,
each node's for its own path (penalties.py), then temperature, min-p, top-k and top-p) and g_t a vector of independent
standard Gumbel variables fixed by the seed and t alone, so it is distributed exactly as r (the Gumbel-max trick),
independently of every other position. The rule walks the tree from the root:
at a node at depth d (the root at position P) it computes the target's token y at position P + d + 1 from the
node's logits, follows the child whose token is y, and stops at a node with no such child, emitting y. Every
emitted token is therefore the target's own sample given the tokens before it, which is what plain sampling with the
same noise emits: the output is the same text, token for token, whatever was drafted and however the drafts were
chosen (the drafters never change the noise; they may read it, :class:`~drafttree.noise.CoupledStepper`). A draft
token x is accepted with probability r(x) when the drafter did not read the noise, as under the residual rule of
Leviathan et al. / Chen et al. for point-mass proposals, and siblings together with the sum of their r.

At temperature 0 the target is deterministic (argmax) and the rule is the same walk without noise.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from drafttree.errors import DraftTreeError
from drafttree.penalties import LogitAdjust
from drafttree.tree import DraftTree

MIN_TEMPERATURE = 1e-6  # below it, logits / temperature may overflow float32


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0  # keep tokens at least min_p times as likely as the likeliest (after the temperature)
    adjust: LogitAdjust | None = None  # penalties, logit_bias, min_tokens: applied per tree node (penalties.py)
    grammar: object | None = None  # structured output (grammar.Grammar): what each node may be followed by

    def __post_init__(self):
        t, p, k, m = self.temperature, self.top_p, self.top_k, self.min_p
        if not _is_number(m) or not (0.0 <= m <= 1.0):
            raise DraftTreeError(f"min_p must be in [0, 1], got {m!r}")
        if not _is_number(t) or not math.isfinite(t) or t < 0:
            raise DraftTreeError(f"temperature must be a finite number >= 0, got {t!r}")
        if 0 < t < MIN_TEMPERATURE:  # logits / t would overflow float32 (a softmax of inf is NaN)
            raise DraftTreeError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {t!r}")
        if not _is_number(p) or not (0.0 < p <= 1.0):
            raise DraftTreeError(f"top_p must be in (0, 1], got {p!r}")
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise DraftTreeError(f"top_k must be an integer >= 0 (0 = off), got {k!r}")

    @classmethod
    def of(cls, temperature, top_p, top_k, min_p=0.0, adjust: LogitAdjust | None = None, grammar=None) -> Sampling:
        """From user values (ints for floats are fine, ``None`` and strings are not): one-line errors, no casts that
        could turn a bad value into a raw TypeError or a silently different one (``int(0.9)`` is 0)."""
        temperature, top_p, top_k, min_p = (x.item() if isinstance(x, torch.Tensor) and x.numel() == 1 else x
                                            for x in (temperature, top_p, top_k, min_p))  # 0-d tensors too
        if _is_number(top_k) and float(top_k).is_integer():
            top_k = int(top_k)
        return cls(float(temperature) if _is_number(temperature) else temperature,
                   float(top_p) if _is_number(top_p) else top_p, top_k,
                   float(min_p) if _is_number(min_p) else min_p, adjust, grammar)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warped_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Float32 logits of the target's sampling distribution: divided by the temperature, -inf below min-p, outside
    the top-k and outside the top-p nucleus (their softmax is :func:`warp_probs`). Rows of a 2-D input are warped
    apart."""
    z = logits.float() - logits.amax(-1, keepdim=True).float()  # the top logit at 0: float32's grid is finest there,
    z.div_(sampling.temperature)  # so at small temperatures z + noise does not round near-ties onto one value
    if sampling.min_p > 0.0:  # p >= min_p * p_max, i.e. z >= log(min_p) with the top logit at 0 (vLLM: before top-k)
        z = z.masked_fill(z < math.log(sampling.min_p), float("-inf"))
    if sampling.top_k and sampling.top_k < z.shape[-1]:
        kth = z.topk(sampling.top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if sampling.top_p < 1.0:
        z = z.masked_fill(nucleus(torch.softmax(z, dim=-1), sampling.top_p) == 0, float("-inf"))
    return z


def warp_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Target sampling distribution from logits: temperature, then min-p, top-k, top-p (nucleus), float32."""
    if sampling.greedy:
        out = torch.zeros_like(logits, dtype=torch.float32)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(warped_logits(logits, sampling), dim=-1)


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


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``, through float32 for half-precision logits: the widening is exact (the same values, the
    same first maximum) and torch's bf16 argmax on the CPU takes ~1.8x as long as widening and the float32 one."""
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    return logits.argmax(-1)


def sample_token(logits: torch.Tensor, sampling: Sampling, noise=None, pos: int | None = None) -> int:
    """The target's token at sequence position ``pos`` from its logits there: the argmax at T = 0, else the argmax
    of the warped logits plus the position's noise (a :class:`~drafttree.noise.Noise`; both required then)."""
    if sampling.greedy:
        return int(greedy_tokens(logits).item())
    if noise is None or pos is None:
        raise ValueError("sampling at T > 0 needs the generation's noise and the token's position")
    z = warped_logits(logits, sampling)
    return int((z + noise.at(pos, z.device)[: z.shape[-1]]).argmax().item())


def accept_greedy(tree: DraftTree, logits: torch.Tensor, best: torch.Tensor | None = None) -> tuple[list[int], int]:
    """Longest root-to-node path whose every token equals the target's argmax at its parent (``best``: that
    argmax, where the caller has it already, e.g. for a batch's rows at once)."""
    best = greedy_tokens(logits) if best is None else best  # [n]
    if tree.size == 1:
        return [0], int(best[0].item())
    match = torch.ones(tree.size, dtype=torch.bool, device=best.device)
    match[1:] = tree.tokens[1:] == best[tree.parents[1:]]
    ok = ~(tree.ancestors & ~match[None, :]).any(1)  # every node on the path matches
    depth = torch.where(ok, tree.depths, torch.full_like(tree.depths, -1))
    node = int(depth.argmax().item())  # deepest accepted node (first one on ties)
    return tree.path_to(node), int(best[node].item())


def accept_sampled(tree: DraftTree, logits: torch.Tensor, sampling: Sampling, noise, pos: int,
                   _broken: bool = False) -> tuple[list[int], int]:
    """The walk of the module docstring: follow the child equal to the target's sample, position by position.

    ``pos`` is the root's sequence position. ``_broken`` exists only for tests: it keys the noise by the depth in
    the round instead of the position (the same noise again every round), a plausible-looking but wrong rule that
    the distribution tests must catch."""
    children = tree.children()
    tokens = tree.tokens.tolist()
    node, path = 0, [0]
    while True:
        at = len(path) if _broken else pos + len(path)  # the position of the token chosen after ``node``
        y = sample_token(logits[node], sampling, noise, at)
        child = next((c for c in children[node] if tokens[c] == y), None)
        if child is None:
            return path, y
        node = child
        path.append(node)


def accept(tree: DraftTree, logits: torch.Tensor, sampling: Sampling, noise, pos: int,
           best: torch.Tensor | None = None) -> tuple[list[int], int]:
    """Greedy or sampled acceptance; ``noise`` and ``pos`` (the root's position) matter only when sampling, ``best``
    (the logits' argmax, if known) only at T = 0."""
    if sampling.greedy:
        return accept_greedy(tree, logits, best)
    return accept_sampled(tree, logits, sampling, noise, pos)
