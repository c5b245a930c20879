"""Sampling as an argmax: one Gumbel noise vector per sequence position, fixed by the seed before any drafting.

The Gumbel-max trick: with g_i independent standard Gumbel variables, argmax_i (log r_i + g_i) is distributed as r.
Here every *position* of a generation gets its own noise vector, a function of (seed, position) only, so the token
the target samples at a position is argmax(log r + g_position), whatever was drafted: speculative decoding accepts a
draft token when it equals that argmax (a greedy rule on perturbed logits), and the output is *the same text plain
sampling gives with the same seed* (drafter-invariant speculative decoding; Daliri, Musco and Suresh 2024), wherever
verifying a tree gives a row the logits one-token decoding gives it (float32; bf16 may differ at near-ties, as at
T = 0). Two consequences the project relies on: a seeded run reproduces whatever the drafters did (their
calibrations, live timings and batch-mates may differ), and drafters may look at the noise to guess the target's
sample (:class:`CoupledStepper`): at T > 0 a drafter then predicts the target's token, not its distribution.
"""

from __future__ import annotations

import torch

from drafttree.accept import Sampling, warped_logits

BLOCK = 8  # positions drawn together (one generator seeding, one call)
_MASK = (1 << 63) - 1


def _mix(x: int) -> int:
    """splitmix64: nearby (seed, block) pairs give unrelated generator seeds."""
    x = (x + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (x ^ (x >> 31)) & _MASK


class Noise:
    """Gumbel noise for every position of one generation, from one seed (float32, ``vocab`` entries)."""

    def __init__(self, seed: int, vocab: int):
        self.seed, self.vocab = int(seed) & _MASK, int(vocab)
        self._blocks: dict[int, torch.Tensor] = {}
        self._on: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._gen = torch.Generator()

    @classmethod
    def from_generator(cls, generator: torch.Generator | None, vocab: int) -> Noise:
        """A generation's noise, seeded by one draw from ``generator`` (so a seeded generator reproduces)."""
        device = generator.device if generator is not None else "cpu"
        seed = torch.randint(0, 2**62, (1,), generator=generator, device=device).item()
        return cls(int(seed), vocab)

    def at(self, pos: int, device: torch.device | None = None) -> torch.Tensor:
        """The noise of position ``pos`` ([vocab], shared: never write to it); a draft vocabulary with fewer rows
        reads its first entries. Blocks are regenerated from the seed when asked for again."""
        block, row = divmod(int(pos), BLOCK)
        if block not in self._blocks:
            if len(self._blocks) >= 5:  # a round reads at most 3 blocks (with ``noise_cells`` the free sources read
                # up to 12 positions ahead): keep the blocks within two of this one, so the root's is never dropped
                for b in [b for b in self._blocks if abs(b - block) > 2]:
                    del self._blocks[b]
                self._on = {k: v for k, v in self._on.items() if abs(k[0] // BLOCK - block) <= 2}
            self._gen.manual_seed(_mix(self.seed ^ _mix(block)))
            u = torch.rand(BLOCK, self.vocab, generator=self._gen).clamp_(min=torch.finfo(torch.float32).tiny)
            self._blocks[block] = u.log_().neg_().log_().neg_()
        g = self._blocks[block][row]
        if device is None or g.device == torch.device(device):
            return g
        key = (int(pos), torch.device(device))
        if key not in self._on:
            self._on[key] = g.to(device)
        return self._on[key]


class CoupledStepper:
    """A drafter's stepper seen through the noise (T > 0): log-softmax(warped draft logits + the noise of the
    position each distribution is for). Its top token is the draft's own sample under the target's noise, which
    equals the target's sample as often as the two distributions agree; the tree builders rank by it unchanged."""

    def __init__(self, stepper, sampling: Sampling, noise: Noise, root_pos: int):
        self.stepper, self.sampling, self.noise, self._root_pos = stepper, sampling, noise, int(root_pos)
        self.vocab_ids = stepper.vocab_ids

    def _couple(self, lp: torch.Tensor, pos: int) -> torch.Tensor:
        g = self.noise.at(pos, lp.device)
        g = g[self.vocab_ids] if self.vocab_ids is not None else g[: lp.shape[-1]]
        s = self.sampling
        plain = s.temperature == 1.0 and not s.top_k and s.top_p >= 1.0  # the common case: one pass fewer
        y = torch.add(lp.float(), g) if plain else warped_logits(lp, s).add_(g)
        return y.sub_(torch.logsumexp(y, dim=-1, keepdim=True))

    def root_logprobs(self) -> torch.Tensor:
        return self._couple(self.stepper.root_logprobs(), self._root_pos + 1)

    def expand(self, tokens, parent_slots, attend, depth: int) -> torch.Tensor:
        return self._couple(self.stepper.expand(tokens, parent_slots, attend, depth), self._root_pos + depth + 1)

    def __getattr__(self, name):
        return getattr(self.stepper, name)


def coupled(stepper, sampling: Sampling, noise: Noise | None, root_pos: int):
    """``stepper`` itself at T = 0 (or without noise), else seen through the noise."""
    if sampling.greedy or noise is None:
        return stepper
    return CoupledStepper(stepper, sampling, noise, root_pos)
