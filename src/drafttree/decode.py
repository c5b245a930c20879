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
from drafttree.logprobs import TokenLogprob, token_logprobs
from drafttree.noise import Noise
from drafttree.penalties import adjusted, adjusted_first, grammar_state
from drafttree.target import TargetModel


@dataclass
class DecodeStats:
    """Counters of one generation. ``accept_lengths`` has one entry per target forward (prefill included):
    the tokens that forward produced (accepted drafts + the target's own token), so tau is their mean."""

    new_tokens: int = 0
    target_forwards: int = 0
    accept_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens the prefix cache held (TargetModel.keep_prefix), not computed again
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_other: float = 0.0
    wall_time: float = 0.0
    finish_reason: str = "length"
    rounds: list[dict] = field(default_factory=list)  # drafter notes per round (e.g. chosen depth)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per new token, when asked for (logprobs.py)

    @property
    def tau(self) -> float:
        return sum(self.accept_lengths) / max(1, len(self.accept_lengths))

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0


class Stopwatch:
    """Adds the time since the last lap to a :class:`DecodeStats` field and to ``wall_time`` (device synced
    first, so GPU work is charged to the step that queued it). Paused while the consumer holds a step."""

    def __init__(self, stats: DecodeStats, device: torch.device):
        self.stats, self.device = stats, device
        self.resume()

    def resume(self) -> None:
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        setattr(self.stats, name, getattr(self.stats, name) + now - self.t)
        self.stats.wall_time += now - self.t
        self.t = now


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
    logprobs: int | None = None,
) -> Iterator[list[int]]:
    """Yield the new tokens of each step (the first from the prefill, then accepted drafts + next token).

    ``stats.wall_time`` counts time spent inside this generator only, not the consumer's time between steps.
    ``logprobs=k``: each new token's log-probability and its k likeliest alternatives go to ``stats.logprobs``.
    """
    stats = stats if stats is not None else DecodeStats()
    watch = Stopwatch(stats, target.device)
    pre = target.prefill(prompt_ids)
    stats.cached_tokens = target.reused
    noise = Noise.from_generator(generator, pre.logits.shape[-1])  # fixes every position's sample (noise.py)
    n_prompt = prompt_ids.numel()
    grammar = grammar_state(sampling)  # structured output: this generation's place in the grammar
    root = sample_token(adjusted_first(sampling, pre.logits[-1], prompt_ids, eos_ids, grammar), sampling, noise,
                        n_prompt)
    watch.lap("time_prefill")
    drafter.begin(prompt_ids, pre.features, root)
    watch.lap("time_draft")
    stats.target_forwards, stats.new_tokens = 1, 1
    stats.accept_lengths.append(1)
    if logprobs is not None:
        stats.logprobs += token_logprobs(pre.logits[-1:], [root], logprobs)
    context = prompt_ids.reshape(-1).tolist() + [root]
    yield [root]
    if root in eos_ids:
        stats.finish_reason = "stop"
        return
    while stats.new_tokens < max_new_tokens:
        if target.length + 1 >= target.max_positions:
            stats.finish_reason = "context"
            return
        watch.resume()
        max_depth = min(max_new_tokens - stats.new_tokens - 1, target.max_positions - target.length - 2)
        req = DraftRequest(context, root, max(0, max_depth), sampling, noise, chain=target.chains_only,
                           target=target)
        tree = drafter.propose(req).to(target.device)  # draft
        if target.chains_only:  # recurrent layers verify a chain, not a tree (chain_target.py)
            tree = tree.first_chain()
        if tree.max_depth > req.max_depth:
            raise RuntimeError(f"drafter {drafter.name} proposed depth {tree.max_depth} > {req.max_depth}")
        watch.lap("time_draft")
        verified = stats.time_verify
        out = target.forward_tree(tree.tokens, tree.depths, tree.ancestors)  # verify
        watch.lap("time_verify")
        drafter.verified(tree.size, len(context), stats.time_verify - verified)
        logits = adjusted(sampling, out.logits, tree, context, n_prompt, eos_ids, grammar)  # per node: its own path
        path, nxt = accept(tree, logits, sampling, noise, req.root_pos)  # accept
        target.commit(path)
        committed = tree.tokens[path].tolist()
        watch.lap("time_other")
        drafter.observe(committed, out.features[path], nxt)  # the drafter learns what was accepted
        watch.lap("time_draft")
        new = committed[1:] + [nxt]
        new = new[: max_new_tokens - stats.new_tokens]
        for i, tok in enumerate(new):
            if tok in eos_ids:
                new = new[: i + 1]
                stats.finish_reason = "stop"
                break
        if logprobs is not None:  # path node i's logits chose the token after it
            stats.logprobs += token_logprobs(out.logits[path], new, logprobs)
        context.extend(new)
        root = nxt
        stats.target_forwards += 1
        stats.new_tokens += len(new)
        stats.accept_lengths.append(len(path))
        stats.tree_sizes.append(tree.size)
        if record_rounds and req.info:
            stats.rounds.append(req.info)
        watch.lap("time_other")
        yield new
        if stats.finish_reason == "stop":
            return
    stats.finish_reason = "length"
