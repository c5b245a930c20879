"""A Gemma 4 assistant (heads/assistant.py) as a tree stepper: what EAGLE's state is for a head.

The state is the root, its position and the target's hidden state before it; each round it also reads the target's
committed keys and values (``attach``: the request carries the target). Nothing is cached between rounds, so nothing
needs rolling back: a node's step needs only its parent's projected output (``slots``)."""

from __future__ import annotations

import torch

from drafttree.errors import DraftTreeError
from drafttree.heads.assistant import AssistantHead


class AssistantState:
    """The tree stepper of an assistant head; ``encode`` takes what EagleState.encode takes."""

    vocab_ids = None

    def __init__(self, head: AssistantHead):
        self.head = head
        self.hidden: torch.Tensor | None = None  # the target's last hidden state before the root
        self.root = 0
        self.root_pos = 0
        self.kv: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._root: tuple[torch.Tensor, torch.Tensor] | None = None  # the root step's (log-probs, projected state)
        self.slots: list[torch.Tensor] = []  # projected states of this round's expanded nodes

    def encode(self, feats: torch.Tensor, next_ids: list[int], start: int) -> None:
        """Committed positions ``start..`` with the target's features there; ``next_ids[-1]`` is the new root."""
        self.hidden = feats[-1]
        self.root = int(next_ids[-1])
        self.root_pos = start + len(next_ids)
        self._root = None
        self.kv = {}  # last round's views: the target's cache may have moved since (they would keep it alive)

    def attach(self, target) -> None:
        """Read the target's committed keys and values for this round's steps (views: nothing is copied)."""
        if target is None or getattr(target, "cache", None) is None:
            raise DraftTreeError("a Gemma 4 assistant drafts from its target's keys and values: one sequence at a time "
                                 "(a batch of rows has none to lend it)")
        n = target.length
        if n != self.root_pos:
            raise RuntimeError(f"the assistant's root is at position {self.root_pos}, the target holds {n} tokens")
        self.kv = {}
        for t, i in self.head.kv_layers.items():
            layer = target.cache.layers[i]
            # sliding layers: a superset of the keys the assistant's window reads (its mask picks them from the end)
            first = 0 if t != "sliding_attention" else max(0, n - 2 * self.head.window - 2)
            self.kv[t] = (layer.keys[..., first:n, :], layer.values[..., first:n, :])
        self.slots = []

    def root_logprobs(self) -> torch.Tensor:
        if self._root is None:
            dev = self.head.fc.weight.device
            logits, state = self.head.step(torch.tensor([self.root], device=dev), self.hidden[None], self.root_pos,
                                           self.kv)
            self._root = (torch.log_softmax(logits[0].float(), dim=-1), state[0])
        return self._root[0]

    def expand(self, tokens: torch.Tensor, parent_slots: torch.Tensor, attend: torch.Tensor,
               depth: int) -> torch.Tensor:
        self.root_logprobs()
        hidden = torch.stack([self._root[1] if s < 0 else self.slots[s] for s in parent_slots.tolist()])
        logits, states = self.head.step(tokens.to(hidden.device), hidden, self.root_pos, self.kv)
        self.slots.extend(states.unbind(0))
        return torch.log_softmax(logits.float(), dim=-1)
