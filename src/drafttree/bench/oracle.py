"""Measurement only: the chain length an oracle would choose (AdaEAGLE's upper bound), outside the library.

:class:`OracleChainDrafter` wraps an EAGLE chain drafter and cuts its chain just before the first token the
target will reject, known from the target's own greedy continuation (plain decoding on a separate cache).
The reference is computed lazily and again whenever the output leaves it (in bf16 a tree verify can flip a
near-tie that plain decoding resolved the other way); that time is kept in ``untimed`` so the benchmark
can leave it out. The decode loop knows nothing of this.
"""

from __future__ import annotations

import time

import torch

from drafttree.accept import Sampling
from drafttree.decode import decode
from drafttree.drafters import Drafter, DraftRequest
from drafttree.drafters.eagle import CHAIN_MAX, ChainShape, EagleDrafter
from drafttree.drafters.length_policies import FixedLength
from drafttree.drafters.options import EagleOptions, parse_options
from drafttree.errors import DraftTreeError
from drafttree.target import TargetModel
from drafttree.tree import DraftTree, grow_chain

ORACLE = "eagle-chain-oracle"


class OracleChainDrafter(Drafter):
    name = ORACLE

    def __init__(self, head, continuation, depth: int = CHAIN_MAX):
        self.inner = EagleDrafter(head, ChainShape(), FixedLength(depth), name=ORACLE)
        self.depth, self.continuation = int(depth), continuation
        self.reference: list[int] = []
        self.untimed = 0.0  # seconds spent computing references, to subtract from the measured time

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        self.inner.begin(prompt, prefill_features, root)

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        self.inner.observe(committed, features, next_root)

    def propose(self, req: DraftRequest) -> DraftTree:
        if not req.sampling.greedy:
            raise DraftTreeError(f"{ORACLE} is a measurement at temperature 0 only")
        start = len(req.context)  # reference index of the first draft token (the root is context[-1])
        if self.reference[:start] != req.context:
            t0 = time.perf_counter()
            self.reference = list(req.context) + self.continuation(list(req.context))
            self.untimed += time.perf_counter() - t0
        ref = self.reference
        depth = min(self.depth, req.max_depth, len(ref) - start)
        if depth <= 0:
            req.info["drafted"] = 0
            return DraftTree.root_only(req.root)
        def wrong(toks: list[int], cum: float) -> bool:  # stop at the first token the target rejects
            return toks[-1] != ref[start + len(toks) - 1]

        if hasattr(self.inner.state, "attach"):  # a Gemma 4 assistant reads the target's keys each round
            self.inner.state.attach(req.target)
        tree = grow_chain(self.inner.state, req.root, depth, stop=wrong)
        toks = tree.tokens[1:].tolist()
        req.info["drafted"] = len(toks)
        if toks and toks[-1] != ref[start + len(toks) - 1]:
            toks.pop()  # the first token the target rejects: an oracle would not draft it
        return DraftTree.chain(req.root, toks, tree.tokens.device)


def oracle_drafter(lm, prompt_ids: torch.Tensor, max_new_tokens: int, options: dict | None = None
                   ) -> OracleChainDrafter:
    """An oracle for one generation of ``lm`` (a SpeculativeModel with a head) from ``prompt_ids``."""
    if lm.head is None:
        raise DraftTreeError(f"{ORACLE} needs an EAGLE head")
    o = parse_options(EagleOptions, ORACLE, options)
    plain = TargetModel(lm.target.model)  # its own KV cache: the measured decode's cache stays untouched
    end = prompt_ids.numel() + max_new_tokens

    def continuation(context: list[int]) -> list[int]:
        prompt = torch.tensor(context, dtype=torch.long)
        steps = decode(plain, Drafter(), prompt, Sampling(), max(1, end - len(context) + 1), lm.eos_ids)
        return [t for step in steps for t in step]

    return OracleChainDrafter(lm.head, continuation, o.depth or CHAIN_MAX)
