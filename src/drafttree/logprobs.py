"""Log-probabilities of the generated tokens, for users who ask for them (``logprobs=k``; OpenAI's ``logprobs``).

They come from the logits the verify forward already computed for each accepted token's position, so asking costs a
log-softmax over the vocabulary per new token, not another forward. Reported under the target's own distribution
(its raw logits: no temperature, top-k or top-p), as OpenAI-compatible servers do by default; they are the same
whichever method drafted, up to the float rounding of a tree row against a one-token forward.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import torch

from drafttree.errors import DraftTreeError

MAX_TOP = 20  # alternatives per token at most (OpenAI's top_logprobs limit)


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # the ``k`` likeliest tokens there, likeliest first


def check_top(k) -> int | None:
    """``None`` (off) or the number of alternatives per token, 0..MAX_TOP."""
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k <= MAX_TOP:
        raise DraftTreeError(f"logprobs must be an integer in 0..{MAX_TOP} (alternatives per token), got {k!r}")
    return int(k)


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int = 0) -> list[TokenLogprob]:
    """Row i of ``logits`` ([n, V], n >= len(tokens)) is the distribution ``tokens[i]`` was chosen from."""
    if not tokens:
        return []
    lp = torch.log_softmax(logits[: len(tokens)].float(), dim=-1)
    chosen = lp.gather(-1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    tops: list[list[tuple[int, float]]] = [[] for _ in tokens]
    if top:
        values, ids = lp.topk(min(top, lp.shape[-1]), dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    return [TokenLogprob(t, c, a) for t, c, a in zip(tokens, chosen, tops)]
