"""Finished rows' caches, kept for newcomers that begin the same way.

A chat client sends the whole conversation again with every turn, so the next turn's prompt begins with the last
turn's prompt and answer: a row that finishes leaves its keys and values here (and its features, which the drafters
read), and a newcomer whose prompt shares a long enough prefix with one of them starts from a copy of it and
computes only the rest (vLLM's automatic prefix caching, on whole sequences). Least recently used entries go first
once the pool holds more than its token budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from drafttree.errors import DraftTreeError
from drafttree.target import common_prefix


@dataclass
class PrefixEntry:
    ids: list[int]
    states: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys and values [heads, len(ids), dim]
    features: torch.Tensor  # [len(ids), F]: what the target handed the drafters for each position


class PrefixPool:
    """Entries by recency (newest last), at most ``max_tokens`` tokens in all. A match needs ``min_match`` tokens
    and ``min_share`` of the newcomer's prompt: a matched newcomer is prefilled alone, not packed with the others
    (where a prompt's products run near the GEMM's peak), which a short shared prefix such as a chat template's
    system prompt does not pay for; a chat's next turn (most of its prompt is the last turn) does."""

    def __init__(self, max_tokens: int = 32768, min_match: int = 16, min_share: float = 0.5):
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise DraftTreeError(f"the prefix cache's size must be a positive number of tokens, got {max_tokens!r}")
        if not isinstance(min_match, int) or min_match <= 0:
            raise DraftTreeError(f"min_match must be a positive number of tokens, got {min_match!r}")
        if not 0.0 <= min_share <= 1.0:
            raise DraftTreeError(f"min_share must be in [0, 1], got {min_share!r}")
        self.max_tokens, self.min_match, self.min_share = max_tokens, min_match, min_share
        self.entries: list[PrefixEntry] = []
        self.hits = self.lookups = self.reused_tokens = 0

    def clear(self) -> None:
        self.entries.clear()

    @property
    def tokens(self) -> int:
        return sum(len(e.ids) for e in self.entries)

    def add(self, entry: PrefixEntry) -> None:
        """Keep ``entry``, newest; an entry it extends (or repeats) is dropped, then the oldest while over budget."""
        n = len(entry.ids)
        if n < self.min_match or n > self.max_tokens:
            return
        self.entries = [e for e in self.entries if common_prefix(e.ids, entry.ids) < len(e.ids)]
        self.entries.append(entry)
        while self.tokens > self.max_tokens:
            self.entries.pop(0)

    def peek(self, ids: list[int]) -> tuple[PrefixEntry, int] | None:
        """What :meth:`best` would return, without counting a lookup or touching the entries' order."""
        found, longest = None, 0
        for e in self.entries:
            p = min(common_prefix(e.ids, ids), len(ids) - 1)
            if p > longest:
                found, longest = e, p
        if found is None or longest < max(self.min_match, self.min_share * len(ids)):
            return None
        return found, longest

    def best(self, ids: list[int]) -> tuple[PrefixEntry, int] | None:
        """The entry sharing the longest prefix with ``ids`` (at most all but its last token) and that length, or
        None when none shares ``min_match`` tokens; a hit becomes the newest entry."""
        self.lookups += 1
        hit = self.peek(ids)
        if hit is None:
            return None
        found, longest = hit
        self.entries.remove(found)
        self.entries.append(found)
        self.hits += 1
        self.reused_tokens += longest
        return found, longest
