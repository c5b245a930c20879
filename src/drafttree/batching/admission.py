"""Newcomers' prefill beside a decoding batch, a bounded number of prompt tokens per round (chunked prefill).

Why: a prefill is one forward over a whole prompt, and every row already decoding waits for it. On a 2-core CPU a
3,000-token prompt takes ~3 s, and every other stream stood still for that long (a burst of newcomers: for the sum of
theirs). vLLM and SGLang bound the prompt tokens of a step (chunked prefill) so that running streams keep their pace;
so does this. While rows decode, a round prefills at most ``chunk`` prompt tokens (each counted with the keys it
reads): the queue's next whole prompts that fit (packed together, as :meth:`BatchTarget.add_many` prefills them), or
the next chunk of a longer one on a cache of its own (a single-sequence target: each chunk attends over the chunks
before it, as a prompt's rest over a cached prefix does), which joins the batch as a row once whole; the whole prompts
waiting right behind such a one may take half a round's budget first (a short request does not wait for a long one's
chunks). With no row decoding nobody waits, and everything queued is prefilled at once. A prompt's tokens are what
they would be alone up to the last bits of its states (a chunk's products and attention ran over fewer rows: float32
~1e-6), as with prefix caching; the batch-invariant setting never chunks (its point is that a request's bits do not
depend on what else is served).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch

from drafttree.errors import DraftTreeError
from drafttree.target import ForwardOutput, TargetModel, decoder_layers

if TYPE_CHECKING:
    from drafttree.batching.decode import BatchDecoder, Sequence

PREFILL_CHUNK = 512  # prompt tokens a round of a decoding batch prefills at most (~0.35 s here); 0: no bound
MIN_CHUNK = 16  # a long prompt's chunk at least, however far into it (a chunk costs a forward of its own)


def keys_per_token(model: torch.nn.Module) -> float:
    """How many keys a token's attention reads for what its products cost (per layer: 2 x the layer's matrix weights
    against 4 x the query heads' width per key): a prompt's later tokens cost more, and a budget of tokens counts
    each token as 1 + its keys / this (SmolLM2-135M: 3,072; 512 tokens after 2,700 others cost ~1.9x the first 512)."""
    try:
        layers = decoder_layers(model.base_model)
    except DraftTreeError:
        return math.inf
    if not len(layers):
        return math.inf
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    width = heads * int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    weights = sum(p.numel() for p in layers[0].parameters() if p.dim() == 2)
    return weights / (2 * width) if weights else math.inf


def prompt_cost(n: int, before: int, k: float) -> float:
    """What ``n`` prompt tokens after ``before`` others cost, in tokens of a fresh prompt (see keys_per_token)."""
    return n + n * (before + n / 2) / k


def tokens_within(budget: float, before: int, k: float) -> int:
    """The most tokens after ``before`` others that cost at most ``budget`` (prompt_cost's inverse)."""
    if k == math.inf:
        return int(budget)
    b = 1 + before / k
    return int(k * (math.sqrt(b * b + 2 * budget / k) - b))


def check_chunk(chunk: object) -> int:
    """``chunk`` as a number of tokens (>= 0), or a one-line error."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
        raise DraftTreeError(f"prefill_chunk must be a number of tokens >= 0 (0: no bound), got {chunk!r}")
    return chunk


class PromptInChunks:
    """One prompt prefilled a chunk at a time on a single-sequence target of its own."""

    def __init__(self, seq: Sequence, model: torch.nn.Module, feature_layers: list[int] | None, pool=None):
        self.seq = seq
        self.ids = seq.prompt_ids.reshape(-1)
        # keep_prefix: each prefill of a longer piece of the prompt computes only what the cache does not hold yet
        self.single = TargetModel(model, feature_layers, keep_prefix=True)
        self.done, self.seconds = 0, 0.0
        self.out: ForwardOutput | None = None
        hit = pool.best(self.ids.tolist()) if pool is not None else None
        self.cached = 0 if hit is None else hit[1]
        if hit is not None:  # a prefix pool's entry (a chat's last turn): only the rest is prefilled, in chunks
            entry, p = hit
            self.single.load_prefix(entry.ids[:p], entry.states, entry.features, room=self.ids.numel() - p)
            self.done = p

    @property
    def left(self) -> int:
        return self.ids.numel() - self.done

    def advance(self, tokens: int) -> None:
        end = min(self.ids.numel(), self.done + max(1, tokens))
        t0 = time.perf_counter()
        self.out = self.single.prefill(self.ids[:end])
        self.seconds += time.perf_counter() - t0
        self.done = end


class Admission:
    """The newcomers a decoding batch holds back, and what this round has prefilled of them (see the module)."""

    PASS_SHARE = 0.5  # of a round's budget, what whole prompts behind a chunked one may take first (0: arrival order)

    def __init__(self, chunk: int = PREFILL_CHUNK):
        self.chunk = check_chunk(chunk)
        self.queue: list[Sequence] = []  # held back, in arrival order
        self.partial: PromptInChunks | None = None  # the queue's first prompt, part prefilled
        self.spent = 0.0  # what the prefills since the last round cost, in tokens of a fresh prompt (prompt_cost)
        self._keys: float | None = None  # keys_per_token of the batch's model
        self._cached: dict[int, int] = {}  # per queued sequence: the tokens a prefix-pool entry held when it came

    def enqueue(self, seqs: list[Sequence], pool) -> None:
        """Hold these back, in order; each one's pool hit is priced once, now (a price, not what its prefill takes)."""
        for s in seqs:
            hit = pool.peek(s.prompt_ids.reshape(-1).tolist()) if pool is not None else None
            self._cached[id(s)] = 0 if hit is None else hit[1]
        self.queue += seqs

    def holds_back(self, dec: BatchDecoder) -> bool:
        """Whether newcomers wait for the rounds' budget instead of being prefilled at once."""
        return self.chunk > 0 and bool(dec.active or self.queue) and not getattr(dec.target, "batch_invariant", False)

    def round_done(self) -> None:
        self.spent = 0.0

    def drop(self, seqs: list[Sequence]) -> None:
        """Forget these (a failed admission the caller retries one by one)."""
        mine = {id(s) for s in seqs}
        self.queue = [s for s in self.queue if id(s) not in mine]
        for key in mine:
            self._cached.pop(key, None)
        if self.partial is not None and id(self.partial.seq) in mine:
            self.partial = None

    def admit(self, dec: BatchDecoder) -> list[tuple[Sequence, list[int]]]:
        """Prefill what this round may of the queue (all of it when no row decodes) and join it to ``dec``'s rows;
        returns each joined sequence's first token (a cancelled one: none, and it is finished)."""
        gone = [s for s in self.queue if s.cancelled]  # they leave now, wherever they wait
        self.drop(gone)
        for s in gone:
            s._finish("cancelled")
        out: list[tuple[Sequence, list[int]]] = [(s, []) for s in gone]
        budget = self.chunk - self.spent if dec.active and self.chunk else math.inf
        if self._keys is None:
            self._keys = keys_per_token(dec.target.model)
        k = self._keys
        passed = False
        while self.queue and budget > 0:
            head = self.queue[0]
            n, cached = head.prompt_ids.numel(), self._cached.get(id(head), 0)
            dear = budget < math.inf and prompt_cost(n - cached, cached, k) > self.chunk
            if self.partial is not None or dear:
                if budget < math.inf and not passed and self.PASS_SHARE > 0:
                    # the whole prompts right behind it that fit half this round's budget pass it: a short request
                    # does not wait for a long one's chunks, and the long one keeps at least the other half
                    passed = True
                    group, total = self._fitting(self.queue[1:], budget * self.PASS_SHARE, k)
                    if group:
                        out += self._prefill(dec, group, total)
                        budget -= total
                if self.partial is None:  # dearer than any round's budget: a chunk a round
                    self.partial = PromptInChunks(head, dec.target.model, dec.target.feature_layers,
                                                  getattr(dec.target, "pool", None))
                done = self.partial.done
                take = self.partial.left if budget == math.inf else tokens_within(budget, done, k)
                if take < MIN_CHUNK and self.spent:
                    break  # what this round has left is not worth a forward: the next round's budget
                take = min(max(MIN_CHUNK, take), self.partial.left)
                self.partial.advance(take)
                cost = prompt_cost(take, done, k)
                self.spent += cost
                budget -= cost
                if self.partial.left == 0:
                    part, self.partial = self.partial, None
                    self.queue.pop(0)
                    self._cached.pop(id(head), None)
                    pre = dec.target.add_prefilled(part.single, part.out, head.max_new_tokens, not part.cached)
                    out.append((head, dec.join([head], [pre], part.seconds, [part.cached])[0]))
                continue
            group, total = self._fitting(self.queue, budget, k)
            if not group:
                break  # the next prompt waits for the next round's budget
            budget -= total
            out += self._prefill(dec, group, total)
        return out

    def _fitting(self, seqs: list[Sequence], budget: float, k: float) -> tuple[list[Sequence], float]:
        """The first of ``seqs`` whose whole prompts fit ``budget`` together (a pool hit: its rest), and their cost."""
        group, total = [], 0.0
        for s in seqs:
            cached = self._cached.get(id(s), 0)
            n = prompt_cost(s.prompt_ids.numel() - cached, cached, k)
            if total + n > budget or (budget < math.inf and n > self.chunk):
                break
            group.append(s)
            total += n
        return group, total

    def _prefill(self, dec: BatchDecoder, group: list[Sequence], cost: float) -> list[tuple[Sequence, list[int]]]:
        """Prefill these whole prompts together (packed) and join them as rows."""
        mine = {id(s) for s in group}
        self.queue = [s for s in self.queue if id(s) not in mine]
        for s in group:
            self._cached.pop(id(s), None)
        self.spent += cost
        return list(zip(group, dec.prefill_now(group)))
