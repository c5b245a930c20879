"""A DFlash drafter (heads/dflash.py) as a tree stepper: what EAGLE's state is for a head.

One drafter forward per round gives the draft distribution of every depth of the block at once: depth d's is the
block's output at position root + d. Those are marginals, not conditioned on the tokens drafted above them, so every
node at depth d has the same children's distribution: a chain is the argmax of each depth (the DFlash paper's own
draft), a tree the best combinations (as Medusa's heads make trees). The state keeps the context keys and values of
every committed position (the target's features there), appending each round's committed positions in the next
round's forward; nothing drafted is ever cached, so nothing needs rolling back.

A DFlash2 drafter's distributions do depend on the path: each depth's top candidates are rescored by the token chosen
above them (its candidate selector), so ``expand`` scores the children of each node after that node's own token, and
outside the candidates a draft has probability zero.
"""

from __future__ import annotations

import torch

from drafttree.errors import DraftTreeError
from drafttree.heads.dflash import DFlashHead


class DFlashState:
    """The tree stepper of a DFlash head; ``encode`` takes what EagleState.encode takes."""

    vocab_ids = None

    def __init__(self, head: DFlashHead):
        self.head = head
        self.max_depth = head.block_size - 1  # the deepest draft one block holds
        self.past: list[list[torch.Tensor]] | None = None  # per layer [keys, values] buffers, room to grow
        self.committed = 0  # context positions whose keys and values are cached
        self.queued: list[torch.Tensor] = []  # features of committed positions not yet in the cache
        self.root = 0
        self.root_pos = 0
        self._out: torch.Tensor | None = None  # this round's block outputs for depths 1.. [block - 1, H]
        self._lp: torch.Tensor | None = None  # ... log-probs of the depths computed so far [d, V]
        self._cands: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # DFlash2: unary, cands, proj
        self._used = self.max_depth  # depths the last round read (the first round computes them all)
        self._first = self.max_depth

    def encode(self, feats: torch.Tensor, next_ids: list[int], start: int) -> None:
        """Committed positions ``start..`` with the target's features there; ``next_ids[-1]`` is the new root."""
        if start != self.committed + sum(f.shape[0] for f in self.queued):
            raise RuntimeError(f"DFlash context out of order: positions from {start}, the drafter holds "
                               f"{self.committed + sum(f.shape[0] for f in self.queued)}")
        self.queued.append(feats)
        self.root = int(next_ids[-1])
        self.root_pos = start + len(next_ids)
        self._out = None

    def _view(self) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        return None if self.past is None else [(k[:, : self.committed], v[:, : self.committed]) for k, v in self.past]

    def _append(self, new: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        c = new[0][0].shape[1]
        end = self.committed + c
        if self.past is None or self.past[0][0].shape[1] < end:
            room = max(2 * end, 64)
            grown = []
            for i, (k, v) in enumerate(new):
                bk = k.new_empty(k.shape[0], room, k.shape[2])
                bv = v.new_empty(v.shape[0], room, v.shape[2])
                if self.past is not None:
                    bk[:, : self.committed] = self.past[i][0][:, : self.committed]
                    bv[:, : self.committed] = self.past[i][1][:, : self.committed]
                grown.append([bk, bv])
            self.past = grown
        for (bk, bv), (k, v) in zip(self.past, new):
            bk[:, self.committed:end] = k
            bv[:, self.committed:end] = v
        self.committed = end

    @torch.inference_mode()
    def _forward(self) -> None:
        """The round's drafter forward (once per round): the block's outputs, and the new context cached."""
        if self._out is not None:
            return
        h = self.head
        dev = h.fc.weight.device
        feats = torch.cat([f.to(dev) for f in self.queued]) if self.queued else None
        if feats is None or self.committed + feats.shape[0] != self.root_pos:
            raise RuntimeError("the DFlash drafter has no context for its root")
        ids = torch.full((h.block_size,), h.mask_token_id, dtype=torch.long, device=dev)
        ids[0] = self.root
        out, new = h.block(h.context(feats), ids, self.committed, self._view())
        self._append(new)
        self.queued = []
        self._out = out[1:]
        self._lp, self._cands = None, None
        # the LM head (most of a round's cost on a small target) runs for the depths the last round used and two more,
        # then for the rest only if a tree goes deeper
        self._first = min(self.max_depth, max(2, self._used + 2))
        self._used = 0

    @torch.inference_mode()
    def _rows(self, depths: int) -> None:
        """Log-probs (and DFlash2's candidates) for at least the first ``depths`` depths of this round's block."""
        self._forward()
        self._used = max(self._used, depths)
        have = 0 if self._lp is None else self._lp.shape[0]
        if have >= depths:
            return
        upto = self._first if have == 0 and depths <= self._first else self.max_depth
        h, out = self.head, self._out[have:upto]
        logits = h.logits(out)
        lp = torch.log_softmax(logits.float(), dim=-1)
        self._lp = lp if self._lp is None else torch.cat([self._lp, lp])
        if h.selector is not None:  # DFlash2: each depth's candidates, rescored by their predecessor later
            unary, cands = logits.topk(min(h.selector.top_k, logits.shape[-1]), dim=-1)
            part = (unary, cands, h.selector.hidden_projection(out))
            self._cands = part if self._cands is None else tuple(torch.cat([a, b]) for a, b in zip(self._cands, part))

    def logprobs(self) -> torch.Tensor:
        """Every depth's draft log-probs [block - 1, V] (their marginals; DFlash2 rescores them per path)."""
        self._rows(self.max_depth)
        return self._lp

    @torch.inference_mode()
    def _selected(self, depth: int, prev: torch.Tensor) -> torch.Tensor:
        """DFlash2: the log-probs [m, V] at ``depth`` (0-based) after each predecessor token in ``prev`` [m]."""
        self._rows(depth + 1)
        unary, cands, proj = (t[depth] for t in self._cands)
        scores = self.head.selector.scores(unary, cands, proj, prev.to(cands.device))
        full = torch.full((prev.numel(), self._lp.shape[-1]), float("-inf"), device=scores.device)
        return full.scatter_(1, cands.expand(prev.numel(), -1), torch.log_softmax(scores.float(), dim=-1))

    def root_logprobs(self) -> torch.Tensor:
        if self.head.selector is not None:
            return self._selected(0, torch.tensor([self.root]))[0]
        self._rows(1)
        return self._lp[0]

    def expand(self, tokens: torch.Tensor, parent_slots: torch.Tensor, attend: torch.Tensor,
               depth: int) -> torch.Tensor:
        """The children's log-probs of ``tokens`` at ``depth``: depth + 1's, whichever their parents."""
        if depth >= self.max_depth:
            raise DraftTreeError(f"a DFlash block of {self.head.block_size} drafts {self.max_depth} tokens deep at "
                                 f"most, asked for depth {depth + 1}")
        if self.head.selector is not None:
            return self._selected(depth, tokens)
        self._rows(depth + 1)
        return self._lp[depth].expand(tokens.numel(), -1)
