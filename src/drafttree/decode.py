"""The decode loop: draft -> verify -> accept -> commit, generic over drafters.

Plain autoregressive decoding is this loop with the drafter that proposes nothing (a root-only tree),
so every method shares the same prefill, sampling and stopping code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from drafttree.accept import Sampling, accept, sample_token
from drafttree.drafters.base import Drafter, DraftRequest
from drafttree.target import TargetModel


@dataclass
class DecodeStats:
    """Counters of one generation. ``accept_lengths`` has one entry per target forward (prefill included):
    the tokens that forward produced (accepted drafts + the target's own token), so tau is their mean."""

    new_tokens: int = 0
    target_forwards: int = 0
    accept_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_other: float = 0.0
    wall_time: float = 0.0
    finish_reason: str = "length"
    rounds: list[dict] = field(default_factory=list)  # drafter notes per round (e.g. chosen depth)

    @property
    def tau(self) -> float:
        return sum(self.accept_lengths) / max(1, len(self.accept_lengths))

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def decode(
    target: TargetModel,
    drafter: Drafter,
    prompt_ids: torch.Tensor,
    sampling: Sampling,
    max_new_tokens: int,
    eos_ids: set[int] | frozenset[int] = frozenset(),
    generator: torch.Generator | None = None,
    stats: DecodeStats | None = None,
    record_rounds: bool = False,
    reproducible: bool = False,
) -> Iterator[list[int]]:
    """Yield the new tokens of each step (the first from the prefill, then accepted drafts + next token).

    ``stats.wall_time`` counts time spent inside this generator only, not the consumer's time between steps.
    """
    stats = stats if stats is not None else DecodeStats()
    dev = target.device
    clock = time.perf_counter
    t_start = clock()
    pre = target.prefill(prompt_ids)
    root = sample_token(pre.logits[-1], sampling, generator)
    _sync(dev)
    t1 = clock()
    stats.time_prefill = t1 - t_start
    drafter.begin(prompt_ids, pre.features, root)
    _sync(dev)
    stats.time_draft += clock() - t1
    stats.target_forwards, stats.new_tokens = 1, 1
    stats.accept_lengths.append(1)
    context = prompt_ids.reshape(-1).tolist() + [root]
    stats.wall_time = clock() - t_start
    yield [root]
    if root in eos_ids:
        stats.finish_reason = "stop"
        return
    while stats.new_tokens < max_new_tokens:
        if target.length + 1 >= target.max_positions:
            stats.finish_reason = "context"
            return
        t0 = clock()
        max_depth = min(max_new_tokens - stats.new_tokens - 1, target.max_positions - target.length - 2)
        req = DraftRequest(context, root, max(0, max_depth), sampling, generator, reproducible=reproducible)
        tree = drafter.propose(req).to(dev)
        t0 += req.info.pop("untimed", 0.0)  # a measurement-only drafter's oracle work is not decoding time
        if tree.max_depth > req.max_depth:
            raise RuntimeError(f"drafter {drafter.name} proposed depth {tree.max_depth} > {req.max_depth}")
        _sync(dev)
        t1 = clock()
        out = target.forward_tree(tree.tokens, tree.depths, tree.ancestors)
        _sync(dev)
        t2 = clock()
        path, nxt = accept(tree, out.logits, sampling, generator)
        target.commit(path)
        committed = tree.tokens[path].tolist()
        t3 = clock()
        drafter.observe(committed, out.features[path], nxt)
        _sync(dev)
        t4 = clock()
        new = committed[1:] + [nxt]
        new = new[: max_new_tokens - stats.new_tokens]
        for i, tok in enumerate(new):
            if tok in eos_ids:
                new = new[: i + 1]
                stats.finish_reason = "stop"
                break
        context.extend(new)
        root = nxt
        stats.target_forwards += 1
        stats.new_tokens += len(new)
        stats.accept_lengths.append(len(path))
        stats.tree_sizes.append(tree.size)
        if record_rounds and req.info:
            stats.rounds.append(req.info)
        stats.time_draft += (t1 - t0) + (t4 - t3)
        stats.time_verify += t2 - t1
        t5 = clock()
        stats.time_other += (t3 - t2) + (t5 - t4)
        stats.wall_time += t5 - t0
        yield new
        if stats.finish_reason == "stop":
            return
    stats.finish_reason = "length"
