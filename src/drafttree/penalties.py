"""Logit adjustments that depend on what came before: OpenAI's presence / frequency penalties and logit_bias, vLLM's
repetition penalty and min_tokens.

They define a different target distribution (the adjusted logits, then temperature, min-p, top-k, top-p), and every
tree node is adjusted for its own path: the tokens generated before the round plus its ancestors in the tree. The
acceptance rule then walks the tree on the adjusted logits exactly as on raw ones (accept.py), so each emitted token is
the adjusted target's own sample: speculative decoding stays exact for the adjusted distribution, whatever drafted.

The definitions are vLLM's (and OpenAI's for the first three): the repetition penalty divides a positive logit (and
multiplies a negative one) of every token seen in the prompt or the output; then each token's logit loses
``frequency_penalty`` times its count in the output and ``presence_penalty`` once if it occurs there; ``logit_bias``
is added first; while fewer than ``min_tokens`` tokens are out, the end tokens are banned.
"""

from __future__ import annotations

import math
import numbers
import re
import threading
from dataclasses import dataclass

import torch

from drafttree.errors import DraftTreeError
from drafttree.grammar import mask_logits
from drafttree.tree import DraftTree

MAX_BIAS = 100.0  # OpenAI's range for logit_bias values
MAX_BIASED = 1024  # tokens one logit_bias may name
_SCRATCH = threading.local()


def _scratch(n: int, vocab: int, device: torch.device) -> torch.Tensor:
    """[n, vocab] float32 memory of this thread, kept between calls (grown as needed)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.device != device or buf.shape[1] != vocab or buf.shape[0] < n:
        buf = _SCRATCH.buf = torch.empty(max(n, 64 if buf is None else buf.shape[0]), vocab, dtype=torch.float32,
                                         device=device)
    return buf[:n]


def _number(name: str, v, lo: float, hi: float, open_lo: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v > hi or v < lo or (
            open_lo and v == lo):
        raise DraftTreeError(f"{name} must be a number in {'(' if open_lo else '['}{lo:g}, {hi:g}], got {v!r}")
    return float(v)


@dataclass(frozen=True)
class LogitAdjust:
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0

    @classmethod
    def of(cls, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, logit_bias=None,
           min_tokens=0, vocab: int | None = None) -> LogitAdjust | None:
        """From user values, checked (one-line errors); None when nothing would change."""
        presence = _number("presence_penalty", presence_penalty, -2.0, 2.0)
        frequency = _number("frequency_penalty", frequency_penalty, -2.0, 2.0)
        repetition = _number("repetition_penalty", repetition_penalty, 0.0, math.inf, open_lo=True)
        if logit_bias is not None and not isinstance(logit_bias, dict):
            raise DraftTreeError(f"logit_bias must be a map of token ids to biases, got {type(logit_bias).__name__}")
        if len(logit_bias or {}) > MAX_BIASED:
            raise DraftTreeError(f"logit_bias may name at most {MAX_BIASED} tokens, got {len(logit_bias)}")
        bias: dict[int, float] = {}
        for k, v in (logit_bias or {}).items():
            tok = int(k) if isinstance(k, str) and re.fullmatch(r"\s*\d+\s*", k, re.ASCII) else k
            if isinstance(tok, bool) or not isinstance(tok, numbers.Integral) or tok < 0 or (
                    vocab is not None and tok >= vocab):
                raise DraftTreeError(f"logit_bias keys must be token ids in 0..{(vocab or 0) - 1}, got {k!r}")
            if int(tok) in bias:
                raise DraftTreeError(f"logit_bias names token {int(tok)} twice")
            bias[int(tok)] = _number("a logit_bias value", v, -MAX_BIAS, MAX_BIAS)
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, numbers.Integral) or min_tokens < 0:
            raise DraftTreeError(f"min_tokens must be an integer >= 0, got {min_tokens!r}")
        out = cls(presence, frequency, repetition, tuple(sorted(bias.items())), int(min_tokens))
        return out if out != cls() else None

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor, ancestors: torch.Tensor, depths: torch.Tensor,
              context: list[int], prompt_len: int, end_ids) -> torch.Tensor:
        """Float32 adjusted logits of tree nodes ``[n, V]``: node i's ``tokens[i]``, ``ancestors[i]`` its path
        (itself included, the root node 0 being ``context``'s last token), ``depths[i]`` its depth; ``context``: the
        prompt (``prompt_len`` tokens) and the tokens generated so far; ``end_ids``: what min_tokens bans. The result
        lives in this thread's scratch memory, valid until its next call (all acceptance needs: a fresh [16, 49152]
        tensor per round cost ~0.8 ms of page faults)."""
        n, vocab = logits.shape
        z = _scratch(n, vocab, logits.device).copy_(logits)
        dev = z.device
        if self.logit_bias:
            toks, biases = zip(*self.logit_bias)
            z[:, list(toks)] += torch.tensor(biases, dtype=torch.float32, device=dev)
        out_so_far = len(context) - prompt_len
        if self.min_tokens and end_ids:
            early = (out_so_far + depths) < self.min_tokens  # the token after node i is output number out+depth+1
            if bool(early.any()):
                ends = torch.tensor(sorted(t for t in end_ids if 0 <= t < vocab), dtype=torch.long, device=dev)
                z[early.nonzero().flatten()[:, None], ends[None, :]] = float("-inf")
        if self.presence_penalty == self.frequency_penalty == 0.0 and self.repetition_penalty == 1.0:
            return z
        ctx = torch.tensor(context, dtype=torch.long, device=dev)
        tree_tokens = tokens.to(dev)
        cols = torch.unique(torch.cat([ctx, tree_tokens]))  # every token whose logit a penalty may touch
        out_counts = torch.zeros(len(cols), dtype=torch.float32, device=dev)
        out_counts.index_add_(0, torch.searchsorted(cols, ctx[prompt_len:]),
                              torch.ones(len(context) - prompt_len, device=dev))
        # node i's path below the root: its ancestors but node 0 (the root is context's last token already)
        path = ancestors.to(dev)[:, 1:].float()  # [n, n - 1]
        hits = torch.zeros(n - 1, len(cols), dtype=torch.float32, device=dev)
        if n > 1:
            hits[torch.arange(n - 1, device=dev), torch.searchsorted(cols, tree_tokens[1:])] = 1.0
        counts = out_counts[None, :] + path @ hits  # [n, cols]: each node's output counts of those tokens
        seen = torch.isin(cols, ctx)[None, :] | (counts > 0)  # in the prompt or the output
        sub = z[:, cols]
        if self.repetition_penalty != 1.0:
            r = self.repetition_penalty
            sub = torch.where(seen, torch.where(sub > 0, sub / r, sub * r), sub)
        sub = sub - self.frequency_penalty * counts - self.presence_penalty * (counts > 0).float()
        z[:, cols] = sub
        return z


def adjusted(sampling, logits: torch.Tensor, tree: DraftTree, context: list[int], prompt_len: int,
             end_ids, grammar=None) -> torch.Tensor:
    """A verified tree's logits as its acceptance reads them: each node's adjusted for its own path where
    ``sampling`` has an adjustment, and restricted to what ``grammar`` (the generation's
    :class:`~drafttree.grammar.GrammarState`) allows after that path; else as they are."""
    adjust = sampling.adjust
    z = logits
    if adjust is not None:
        z = adjust.apply(logits, tree.tokens, tree.ancestors, tree.depths, context, prompt_len, end_ids)
    if grammar is not None:
        grammar.sync(context[prompt_len:])
        bits = grammar.bitmasks(tree)
        if z is logits:
            z = _scratch(*logits.shape, logits.device).copy_(logits)
        mask_logits(z, bits)
    return z


def adjusted_first(sampling, last: torch.Tensor, prompt_ids: torch.Tensor, end_ids, grammar=None) -> torch.Tensor:
    """The prefill's last logits as the first token's sample reads them (the prompt's last token a lone root)."""
    if sampling.adjust is None and grammar is None:
        return last
    prompt = prompt_ids.reshape(-1).tolist()
    root = DraftTree.root_only(prompt[-1], last.device)
    return adjusted(sampling, last[None], root, prompt, len(prompt), end_ids, grammar)[0]


def constrained(sampling) -> bool:
    """Whether a generation's logits are adjusted before acceptance (penalties, biases or a grammar)."""
    return sampling.adjust is not None or sampling.grammar is not None


def grammar_state(sampling):
    """A new generation's place in ``sampling``'s grammar (grammar.py), or None."""
    return None if sampling.grammar is None else sampling.grammar.start()
