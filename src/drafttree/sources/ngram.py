"""Context n-grams: a suffix index over the context that proposes what followed earlier occurrences.

The index maps every n-gram (n = 1..``max_ngram``) of the context to the positions that followed it and
grows with the committed tokens (never rebuilt per round). Each round the context's last n tokens are
looked up from the longest n down; every earlier occurrence proposes the tokens that followed it, with its
*match length* (how far back it agrees with the context, up to ``max_match``). Occurrences are merged into a
trie whose nodes count how many occurrences agree on them. A node's acceptance estimate comes from the
calibration cell (match length, agreeing count, depth), learned online against what the target accepted.
"""

from __future__ import annotations

import torch

from drafttree.sources.base import (
    Calibration,
    NoiseCalibration,
    Proposal,
    RoundContext,
    Trie,
    noise_cells,
    trie_proposal,
)

MATCH_BUCKETS = (1, 2, 3, 4, 8)  # match length >= edge
COUNT_BUCKETS = (1, 2, 3)
DEPTH_BUCKETS = (1, 2, 3, 5)


def _bucket(x: int, edges: tuple[int, ...]) -> int:
    b = 0
    for i, e in enumerate(edges):
        if x >= e:
            b = i
    return b


def ngram_prior() -> torch.Tensor:
    """Prior acceptance rates per cell before any observation: longer and more agreeing matches do better."""
    base = [0.2, 0.35, 0.5, 0.6, 0.7]
    out = torch.zeros(len(MATCH_BUCKETS), len(COUNT_BUCKETS), len(DEPTH_BUCKETS))
    for m, b in enumerate(base):
        for c in range(len(COUNT_BUCKETS)):
            out[m, c, :] = min(0.9, b + 0.05 * c)
    return out.reshape(-1)


def _table(edges: tuple[int, ...]) -> list[int]:
    """The bucket of every value up to the last edge (larger values share the last bucket)."""
    return [_bucket(x, edges) for x in range(edges[-1] + 1)]


_MATCH, _COUNT, _DEPTH = _table(MATCH_BUCKETS), _table(COUNT_BUCKETS), _table(DEPTH_BUCKETS)


def cell(match: int, count: int, depth: int) -> int:
    m = _MATCH[min(match, len(_MATCH) - 1)]
    c = _COUNT[min(count, len(_COUNT) - 1)]
    d = _DEPTH[min(depth, len(_DEPTH) - 1)]
    return (m * len(COUNT_BUCKETS) + c) * len(DEPTH_BUCKETS) + d


class SuffixIndex:
    """n-gram -> start positions of what followed it, over a growing token list."""

    def __init__(self, max_ngram: int = 4):
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], list[int]] = {}

    def extend(self, new: list[int]) -> None:
        toks = self.tokens
        for t in new:
            toks.append(t)
            end = len(toks)  # the n-grams ending at the new token are followed by position `end`
            for n in range(1, min(self.max_ngram, end) + 1):
                self.table.setdefault(tuple(toks[end - n:end]), []).append(end)

    def sync(self, context: list[int]) -> None:
        """Index the tokens of ``context`` not seen yet (``context`` extends what was indexed)."""
        n = len(self.tokens)
        if len(context) < n or context[n - 1: n] != self.tokens[n - 1: n]:
            self.tokens, self.table = [], {}
            n = 0
        self.extend(context[n:])

    def matches(self, max_candidates: int, max_match: int = 32) -> list[tuple[int, int]]:
        """Up to ``max_candidates`` (start of continuation, match length) of the context's suffix, longest
        n-gram first, most recent first within an n; the suffix's own position is excluded."""
        toks, end = self.tokens, len(self.tokens)
        out: list[tuple[int, int]] = []
        seen: set[int] = set()
        for n in range(min(self.max_ngram, end - 1), 0, -1):
            for p in reversed(self.table.get(tuple(toks[end - n:]), ())):
                if p >= end or p in seen:
                    continue
                seen.add(p)
                m = n
                while m < max_match and p - m - 1 >= 0 and toks[p - m - 1] == toks[end - m - 1]:
                    m += 1
                out.append((p, m))
                if len(out) >= max_candidates:
                    return out
        return out


class NgramSource:
    """Prompt lookup as a candidate source (free to run: no model call)."""

    name = "ngram"
    cost = 0.0

    def __init__(self, max_ngram: int = 4, num_tokens: int = 12, max_candidates: int = 8):
        self.index = SuffixIndex(max_ngram)
        self.num_tokens, self.max_candidates = num_tokens, max_candidates
        self.calibration = Calibration(ngram_prior())

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        self.index = SuffixIndex(self.index.max_ngram)

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        pass

    def propose(self, rc: RoundContext, index: int) -> Proposal | None:
        k = min(self.num_tokens, rc.max_depth)
        if k <= 0:
            return None
        self.index.sync(rc.context)
        toks = self.index.tokens
        found = self.index.matches(self.max_candidates)
        if rc.min_accept > 0 and found:  # every node scores at most its first token: is any first token good enough?
            first: dict[int, tuple[int, int]] = {}
            for p, m in found:
                if p < len(toks):
                    c, best = first.get(toks[p], (0, 0))
                    first[toks[p]] = (c + 1, max(best, m))
            cells = noise_cells(self.calibration, [cell(m, c, 1) for c, m in first.values()], list(first),
                                [1] * len(first), rc)  # at T > 0 split by noise bin (sources/base.py)
            if max((self.calibration.rate_of(c) for c in cells), default=0.0) < rc.min_accept:
                return None
        trie = Trie()
        for p, m in found:
            trie.add(toks[p:p + k], 1, m)
        if not trie.tokens:
            return None
        cells = noise_cells(self.calibration, [cell(m, c, d) for m, c, d in zip(trie.tags, trie.weights, trie.depths)],
                            trie.tokens, trie.depths, rc)
        return trie_proposal(index, trie.tokens, trie.parents, torch.tensor(cells, dtype=torch.long), self.calibration)

    def sampled_calibration(self) -> NoiseCalibration:
        """This source's calibration at T > 0: its cells split by noise bin (sources/base.py, NOISE_EDGES)."""
        return NoiseCalibration(ngram_prior())
