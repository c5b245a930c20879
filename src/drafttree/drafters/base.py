"""The drafter interface: everything a new drafting method implements (one file per drafter)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from drafttree.accept import Sampling
from drafttree.tree import DraftTree

if TYPE_CHECKING:
    from drafttree.noise import Noise


@dataclass
class DraftRequest:
    """What the decode loop tells a drafter before each round."""

    context: list[int]  # every token so far, prompt and generated, ending with the root
    root: int  # the last token: chosen by the target, not yet in its KV cache
    max_depth: int  # never propose deeper than this (remaining budget / context window)
    sampling: Sampling
    noise: Noise | None  # the generation's Gumbel noise: T > 0 drafters may read it
    info: dict = field(default_factory=dict)  # drafters may leave per-round notes (e.g. chosen depth)
    # batched decoding: the verify cost charged to this row (a budget.BatchShare); None = the row is alone
    cost: object | None = None
    # the target verifies chains only (chain_target.py): a drafter that ranks its nodes proposes its best chain (the
    # decode loop takes any other tree's first chain)
    chain: bool = False
    # the target verifying this sequence (target.TargetModel; None in a batch): drafters that attend to its committed
    # keys and values (Gemma 4's assistants) read them here
    target: object | None = None

    @property
    def root_pos(self) -> int:
        """The root's sequence position (its children are at ``root_pos + 1``)."""
        return len(self.context) - 1


class Drafter:
    """Proposes a draft tree each round and learns what the target accepted.

    ``begin`` sees the prompt and the target's prefill features; ``propose`` returns a tree rooted at the
    current root; ``observe`` receives the committed tokens (root + accepted drafts), the target's
    features at those positions and the next root. AR decoding is the drafter that proposes nothing.
    """

    name = "ar"

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        pass

    def propose(self, req: DraftRequest) -> DraftTree:
        return DraftTree.root_only(req.root)

    def ranked(self) -> list[float] | None:
        """The tree just proposed, node by node: each draft node's estimated probability of being accepted, best
        first (a node never before its parent), so that a batch can keep its best nodes over all rows (:meth:`shrink`);
        None: the tree is verified as it is."""
        return None

    def shrink(self, nodes: int) -> DraftTree:
        """The root and the first ``nodes`` draft nodes of :meth:`ranked`, as if that tree had been proposed (what
        the drafter learns from the round is then about those nodes only). Only after :meth:`ranked` gave a list."""
        raise NotImplementedError(f"drafter {self.name} does not rank its nodes")

    def verified(self, tokens: int, context: int, seconds: float) -> None:
        """This round's tree (``tokens`` tokens after ``context``) took ``seconds`` to verify: drafters that size
        trees by the verify-cost curve may correct it (live_curve.py). Lone decoding only."""

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        pass

    def keep_prefix(self, on: bool) -> None:
        """Whether a model of the drafter's own (a draft LM) keeps its cache between generations, to feed the next
        context from where it parts from the last (the target's ``prefix_cache``); what it holds now is dropped
        either way. Nothing to keep here."""
