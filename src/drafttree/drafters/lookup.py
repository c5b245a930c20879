"""Prompt lookup: draft by finding the latest n-gram of the context earlier in the context.

Each earlier occurrence of the context's last n tokens (n from ``max_ngram`` down to ``min_ngram``)
proposes the tokens that followed it. Up to ``max_candidates`` continuations from the most recent matches
are merged into a trie, so several guesses are verified in the same target forward.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from drafttree.drafters.base import Drafter, DraftRequest
from drafttree.tree import DraftTree


def find_continuations(context: list[int] | np.ndarray, max_ngram: int, min_ngram: int, num_tokens: int,
                       max_candidates: int) -> list[list[int]]:
    arr = np.asarray(context, dtype=np.int64)
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for n in range(min(max_ngram, len(arr) - 1), min_ngram - 1, -1):
        pattern = arr[-n:]
        windows = sliding_window_view(arr[:-1], n)  # windows that end before the context's last token
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        for start in hits[::-1]:  # most recent first
            cont = arr[start + n: start + n + num_tokens].tolist()
            if not cont or tuple(cont) in seen:
                continue
            seen.add(tuple(cont))
            out.append(cont)
            if len(out) >= max_candidates:
                return out
        if out:
            return out
    return out


def trie_tree(root: int, continuations: list[list[int]], device="cpu") -> DraftTree:
    """Merge token sequences sharing prefixes into one tree rooted at ``root``."""
    tokens, parents = [root], [-1]
    child: dict[tuple[int, int], int] = {}
    for seq in continuations:
        node = 0
        for tok in seq:
            key = (node, tok)
            if key not in child:
                child[key] = len(tokens)
                tokens.append(tok)
                parents.append(node)
            node = child[key]
    return DraftTree.from_parents(torch.tensor(tokens, device=device), torch.tensor(parents, device=device))


class LookupDrafter(Drafter):
    name = "lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_tokens: int = 10, max_candidates: int = 4,
                 device: str | torch.device = "cpu"):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.num_tokens, self.max_candidates = num_tokens, max_candidates
        self.device = device

    def propose(self, req: DraftRequest) -> DraftTree:
        k = min(self.num_tokens, req.max_depth)
        if k <= 0:
            return DraftTree.root_only(req.root, self.device)
        conts = find_continuations(req.context, self.max_ngram, self.min_ngram, k, self.max_candidates)
        return trie_tree(req.root, conts, self.device)
