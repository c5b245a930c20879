"""Continuous batching: several sequences draft, verify, accept and commit together.

Each row keeps its own drafter, sampling settings, noise (noise.py) and acceptance; only the target
forward is shared (:class:`~drafttree.batching.target.BatchTarget`). A newcomer joins between rounds
(its prefill is its own forward), a finished or cancelled row leaves at the next round. Every row is charged
a :class:`~drafttree.budget.BatchShare` of the forward, so drafters that size trees on the verify-cost curve
shrink their trees as the batch grows; what a batch's forward takes beyond the curve (each row attends over its own
context) is measured from the rounds and charged too. Per row the acceptance rule is the single-sequence one, so each
row's output is exactly what decoding it alone would give, token for token (at T > 0 with the same seed: the noise fixes
each position's sample, whatever the batch drafted).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from drafttree.accept import Sampling, accept, greedy_tokens, sample_token
from drafttree.batching.admission import PREFILL_CHUNK, Admission
from drafttree.batching.head_pass import HeadBatch, HeadRow
from drafttree.batching.policy import DraftOrPlain, DraftWhilePays
from drafttree.batching.target import BatchTarget
from drafttree.budget import BatchShare, CostModel
from drafttree.decode import DecodeStats
from drafttree.drafters.base import Drafter, DraftRequest
from drafttree.logprobs import token_logprobs
from drafttree.noise import Noise
from drafttree.penalties import adjusted, adjusted_first, constrained, grammar_state
from drafttree.tree import DraftTree


@dataclass(eq=False)
class Sequence:
    """One request in the batch: its settings, and its progress (read by the caller after each round)."""

    prompt_ids: torch.Tensor
    drafter: Drafter
    sampling: Sampling = field(default_factory=Sampling)
    max_new_tokens: int = 256
    eos_ids: frozenset[int] = frozenset()
    generator: torch.Generator | None = None  # seeds the row's noise (noise.py) at its prefill
    tag: object = None  # the caller's handle (e.g. a server request)
    logprobs: int | None = None  # k: each new token's log-probability and k alternatives to stats.logprobs
    stats: DecodeStats = field(default_factory=DecodeStats)
    tokens: list[int] = field(default_factory=list)  # new tokens so far
    finished: bool = False
    cancelled: bool = False  # set from any thread; the row leaves at the next round
    context: list[int] = field(default_factory=list, repr=False)
    root: int = -1
    last_tree: int = 1
    noise: Noise | None = field(default=None, repr=False)
    grammar: object | None = field(default=None, repr=False)  # structured output: the row's place in its grammar
    # with a prefix pool: the features of every position the row's cache holds (kept in the pool when it leaves)
    features: list[torch.Tensor] | None = field(default=None, repr=False)

    def _finish(self, reason: str) -> None:
        self.finished = True
        self.stats.finish_reason = reason
        self.noise = None  # up to 3 blocks of 8 positions x the vocabulary: not kept for finished rows
        self.grammar = None


class BatchDecoder:
    """The batched decode loop: :meth:`add` a sequence (prefill), :meth:`step` one round for all rows."""

    def __init__(self, target: BatchTarget, cost: CostModel | None = None, policy: DraftOrPlain | None = None,
                 head_batch: HeadBatch | None = None, prefill_chunk: int = PREFILL_CHUNK):
        """``policy`` decides per round whether rows draft at all (default :class:`DraftWhilePays`: while the drafts pay
        for all they add to a round; :class:`AlwaysDraft`: every round, each row's drafter sizing its tree on its share
        of the forward; :class:`DraftOrPlain`: measured per batch size from whole rounds). ``prefill_chunk``: prompt
        tokens a round prefills at most while rows decode (admission.py; 0: newcomers are prefilled at once)."""
        self.target, self.cost = target, cost
        self.admission = Admission(prefill_chunk)
        self._undelivered: list[tuple[Sequence, list[int]]] = []  # first tokens of earlier newcomers add_many admitted
        self.policy = policy if policy is not None else DraftWhilePays()
        self.active: list[Sequence] = []
        self._joined = False  # a row joined since the last round (that round also pays for the cache growing)
        # seconds per row a batch's forward took beyond the curve at its token count (decayed mean of rounds no row
        # joined): each row attends over its own context, which the curve, measured on one sequence, does not see
        self.excess_per_row: float | None = None
        self.head_batch = head_batch if head_batch is not None else HeadBatch()
        # requests waiting for a row, set by whoever feeds the decoder before each step: with none, a row that ends
        # early frees nothing and the policy judges drafting by the row with the most tokens left (``tail``)
        self.waiting = 0

    @property
    def rows(self) -> int:
        """Rows decoding and newcomers held back for their prefill (each has its place in the batch), and newcomers
        whose first token the next :meth:`step` hands out although they already ended."""
        return len(self.active) + len(self.admission.queue) + sum(s.finished for s, _ in self._undelivered)

    @property
    def held_back(self) -> list[Sequence]:
        return list(self.admission.queue)

    def _emit(self, seq: Sequence, new: list[int]) -> list[int]:
        new = new[: seq.max_new_tokens - seq.stats.new_tokens]
        for i, tok in enumerate(new):
            if tok in seq.eos_ids:
                new = new[: i + 1]
                seq._finish("stop")
                break
        seq.tokens.extend(new)
        seq.context.extend(new)
        seq.stats.new_tokens += len(new)
        if not seq.finished and seq.stats.new_tokens >= seq.max_new_tokens:
            seq._finish("length")
        return new

    @torch.inference_mode()
    def add(self, seq: Sequence) -> list[int] | None:
        """Prefill ``seq`` and append it as a row; returns its first token (it may already be finished), or None
        where it waits for a later round's prefill (see :meth:`add_many`)."""
        return self.add_many([seq])[0]

    @torch.inference_mode()
    def add_many(self, seqs: list[Sequence]) -> list[list[int] | None]:
        """Prefill several sequences together (one packed forward where the target allows it) and append them as
        rows, in order; returns each one's first token (a row may already be finished). While rows decode, what
        does not fit this round's prefill budget waits (None here): its first token comes from a later
        :meth:`step`, in the order they came (admission.py)."""
        if not seqs:
            return []
        if not self.admission.holds_back(self):
            return self.prefill_now(seqs)
        self.admission.enqueue(seqs, getattr(self.target, "pool", None))
        mine = {id(s) for s in seqs}
        joined = {}
        for s, new in self.admission.admit(self):  # earlier newcomers may join too: the next step hands theirs out
            if id(s) in mine:
                joined[id(s)] = new
            else:
                self._undelivered.append((s, new))
        return [joined.get(id(s)) for s in seqs]

    def prefill_now(self, seqs: list[Sequence]) -> list[list[int]]:
        """Prefill these together and join them as rows; returns each one's first token."""
        t0 = time.perf_counter()
        pres = self.target.add_many([s.prompt_ids for s in seqs], [s.max_new_tokens for s in seqs])
        reused = getattr(self.target, "last_reused", None) or [0] * len(seqs)
        return self.join(seqs, pres, time.perf_counter() - t0, reused)

    def join(self, seqs: list[Sequence], pres: list, spent: float, reused: list[int]) -> list[list[int]]:
        """Append prefilled sequences as rows (``pres``: their prefill outputs, which took ``spent`` seconds;
        ``reused``: each one's tokens from the prefix pool); returns each one's first token."""
        news = []
        keep = getattr(self.target, "pool", None) is not None
        for seq, pre, cached in zip(seqs, pres, reused):
            t1 = time.perf_counter()
            seq.noise = Noise.from_generator(seq.generator, pre.logits.shape[-1])
            seq.grammar = grammar_state(seq.sampling)
            first = adjusted_first(seq.sampling, pre.logits[-1], seq.prompt_ids, seq.eos_ids, seq.grammar)
            root = sample_token(first, seq.sampling, seq.noise, seq.prompt_ids.numel())
            seq.drafter.begin(seq.prompt_ids, pre.features, root)
            st = seq.stats
            st.cached_tokens = cached
            seq.features = [pre.features.clone()] if keep else None  # not a view that keeps a packed prefill's alive
            st.time_prefill = st.wall_time = spent + time.perf_counter() - t1  # every newcomer waits for the forward
            st.target_forwards = 1
            st.accept_lengths.append(1)
            seq.context = seq.prompt_ids.reshape(-1).tolist()
            seq.root = root
            self.active.append(seq)
            news.append(self._emit(seq, [root]))
            if seq.logprobs is not None:
                st.logprobs += token_logprobs(pre.logits[-1:], news[-1], seq.logprobs)
        self._joined = True
        if any(s.finished for s in seqs):
            self._drop_finished()
        return news

    def _drop_finished(self) -> list[tuple[Sequence, list[int]]]:
        """Remove finished and cancelled rows; returns the rows cancelled since the last round. A removed row's
        place goes to a row from the end (the cache moves one row per removed row, not every row after it: ~5% of a
        burst of 64 users' rounds); rows' outputs do not depend on their order."""
        alive = [i for i, s in enumerate(self.active) if not (s.finished or s.cancelled)]
        cancelled = [s for s in self.active if s.cancelled and not s.finished]
        for s in cancelled:
            s._finish("cancelled")
        for i, s in enumerate(self.active):  # leaving rows' states go to the prefix pool, if there is one
            if (s.finished or s.cancelled) and s.features is not None:
                self.target.remember(i, s.context, torch.cat(s.features))
                s.features = None
        m = len(alive)
        order = list(range(m))
        holes = [i for i in range(m) if self.active[i].finished or self.active[i].cancelled]
        for hole, last in zip(holes, [i for i in alive if i >= m]):
            order[hole] = last
        self.target.keep(order)
        self.active = [self.active[i] for i in order]
        return [(s, []) for s in cancelled]

    measure_excess = True  # False: batched rows size trees on the curve alone (the rule until stop 55)
    # the batch keeps the best nodes over every row's offer (pack_counts); rows whose drafter does not rank its nodes,
    # or is told not to (auto:batch_pack=false), size their own trees on their share as before
    pack = True
    EXCESS_DECAY = 0.8

    def _measure_excess(self, seconds: float, tokens: int, rows: int) -> None:
        """Learn what a batch's forward costs beyond the curve at its token count, per row. A row sizing its tree
        adds what its own nodes cost by attending over its context (``BatchShare.per_node``): the margin that decides
        a node; what the forward measured (the other rows' attention included) is the round every node is weighed
        against."""
        over = max(0.0, (seconds - self.cost.verify_in_batch(tokens)) / rows)
        prev = self.excess_per_row
        self.excess_per_row = over if prev is None else self.EXCESS_DECAY * prev + (1 - self.EXCESS_DECAY) * over

    def _extra_verify(self, trees: list[DraftTree]) -> float:
        """The modelled seconds a round's forward spent on its drafted tokens (beyond every row's root): the curve
        over the batch's tokens, and each drafted token's attention over its row's context."""
        if self.cost is None:
            return 0.0
        total = sum(t.size for t in trees)
        if total == len(trees):
            return 0.0
        per_key, past = getattr(self.cost, "per_key", 0.0), getattr(self.cost, "context", 0)
        attend = sum((t.size - 1) * max(0, n - past) for t, n in zip(trees, self.target.lens)) * per_key
        return max(0.0, self.cost.verify_in_batch(total) - self.cost.verify_in_batch(len(trees))) + attend

    def _row_seconds(self, rows: int) -> float:
        """What one row adds to a plain round of ``rows`` rows (the curve's step there and the row's measured excess):
        what each round saves once a row that is not the last to end has ended."""
        if self.cost is None or rows < 2:
            return 0.0
        step = self.cost.verify_in_batch(rows) - self.cost.verify_in_batch(rows - 1)
        return max(0.0, step) + (self.excess_per_row or 0.0)

    def _head_pass(self, rows: list[Sequence], plans: list) -> dict[int, float]:
        """Draft the heads of the batched rows together (``HeadBatch``); returns each drafted row's share of it."""
        if len(rows) < 2:
            return {}
        parts, where = [], []
        for i, (seq, (cost, depth)) in enumerate(zip(rows, plans)):
            ask = getattr(seq.drafter, "batch_head", None)
            got = ask(cost, seq.sampling.greedy) if ask is not None and cost is not None else None
            if got is not None and depth >= 1:
                parts.append(HeadRow(got[0], got[1], depth, seq.drafter))
                where.append(i)
        spent = self.head_batch.draft(parts, len(rows)) if parts else 0.0
        return {i: spent / len(where) for i in where} if spent else {}

    def _pack(self, rows: list[Sequence], trees: list[DraftTree], plans: list, fixed: float) -> list[DraftTree]:
        """Keep the best draft nodes over all rows (:func:`pack_counts`); each row that ranked its nodes shrinks to
        its share of them. One row's tree alone seldom pays for a forward's next block of rows (AMX tiles: 16), while
        the batch's best nodes together may, and a batch short of a block fills it nearly free."""
        ranked = [s.drafter.ranked() if t.size > 1 else None for s, t in zip(rows, trees)]
        if not any(r for r in ranked):
            return trees
        counts = pack_counts(ranked, [t.size for t in trees], [t.expected_accept or 0.0 for t in trees],
                             lambda n: self.cost.verify_in_batch(n) + fixed,
                             [getattr(p[0], "per_node", 0.0) for p in plans])
        return [t if r is None or k >= t.size - 1 else s.drafter.shrink(k).to(self.target.device)
                for s, t, r, k in zip(rows, trees, ranked, counts)]

    @torch.inference_mode()
    def step(self) -> list[tuple[Sequence, list[int]]]:
        """One draft -> verify -> accept -> commit round over every row; returns each row's new tokens (and the
        first token of each newcomer whose prefill ended before the round: it decodes in the round too)."""
        joined, self._undelivered = self._undelivered, []
        joined += self.admission.admit(self) if self.admission.queue else []
        try:
            return joined + self._round()
        finally:
            self.admission.round_done()

    def _round(self) -> list[tuple[Sequence, list[int]]]:
        ended = self._drop_finished()
        for i, seq in enumerate(self.active):
            if not self.target.check_room(i):
                seq._finish("context")
        ended += [(s, []) for s in self.active if s.finished]
        self._drop_finished()
        if not self.active:
            return ended
        t_round = time.perf_counter()
        rows, tgt = self.active, self.target
        sizes = [s.last_tree for s in rows]
        total = sum(sizes)
        committed = [s.stats.accept_lengths[-1] for s in rows]  # each row's tokens last round: this round's guess
        all_committed = sum(committed)
        trees, draft_times = [], []
        kind = ",".join(sorted({s.drafter.name for s in rows}))  # the drafters' mix (policies may learn per mix)
        left = [s.max_new_tokens - s.stats.new_tokens for s in rows]
        tail = self.waiting == 0 and len(rows) > 1
        drafting = self.policy.choose(len(rows), kind, tail=tail)
        plans = []
        fixed = len(rows) * (self.excess_per_row or 0.0) if self.measure_excess else 0.0
        per_key = getattr(self.cost, "per_key", 0.0) if self.measure_excess else 0.0
        past = getattr(self.cost, "context", 0)  # the curve's own context (its forwards attend over that many keys)
        for i, seq in enumerate(rows):
            batched = self.cost is not None and len(rows) > 1
            cost = (BatchShare(self.cost, total - sizes[i], len(rows), float(all_committed - committed[i]), fixed,
                               per_key * max(0, tgt.lens[i] - past), packed=self.pack) if batched else None)
            depth = min(seq.max_new_tokens - seq.stats.new_tokens - 1, tgt.max_positions - tgt.lens[i] - 2)
            plans.append((cost, max(0, depth)))
        t_drafting = time.perf_counter()
        pass_share = self._head_pass(rows, plans) if drafting else {}
        for i, seq in enumerate(rows):
            t0 = time.perf_counter()
            if not drafting:
                trees.append(DraftTree.root_only(seq.root, tgt.device))
                draft_times.append(0.0)
                continue
            cost, depth = plans[i]
            req = DraftRequest(seq.context, seq.root, depth, seq.sampling, seq.noise, cost=cost)
            tree = seq.drafter.propose(req).to(tgt.device)
            if tree.max_depth > req.max_depth:
                raise RuntimeError(f"drafter {seq.drafter.name} proposed depth {tree.max_depth} > {req.max_depth}")
            trees.append(tree)
            draft_times.append(time.perf_counter() - t0 + pass_share.get(i, 0.0))
        if drafting and self.pack and len(rows) > 1 and self.cost is not None:
            t0 = time.perf_counter()
            trees = self._pack(rows, trees, plans, fixed)
            draft_times = [d + (time.perf_counter() - t0) / len(rows) for d in draft_times]
        t_drafting = time.perf_counter() - t_drafting if drafting else 0.0
        extra_verify = self._extra_verify(trees) if drafting else 0.0
        t0 = time.perf_counter()
        outs = tgt.forward_trees(trees)
        t_verify = time.perf_counter() - t0
        if len(rows) == 1:  # a row alone: its forward is a lone sequence's, whose time corrects its curve
            rows[0].drafter.verified(trees[0].size, len(rows[0].context), t_verify)
        elif self.cost is not None and not self._joined:
            self._measure_excess(t_verify, sum(t.size for t in trees), len(rows))
        best = [None] * len(rows)
        if any(s.sampling.greedy for s in rows):  # one argmax over every row's logits (they are one tensor)
            best = greedy_tokens(tgt.last_logits).split([t.size for t in trees])
        accepted = [accept(t, adjusted(s.sampling, o.logits, t, s.context, s.prompt_ids.numel(), s.eos_ids,
                                    s.grammar),
                           s.sampling, s.noise, len(s.context) - 1,  # the root's position
                           best=None if constrained(s.sampling) else b)
                    for s, t, o, b in zip(rows, trees, outs, best)]
        tgt.commit([path for path, _ in accepted])
        results = []
        for seq, tree, out, (path, nxt), t_draft in zip(rows, trees, outs, accepted, draft_times):
            t0 = time.perf_counter()
            committed = tree.tokens[path].tolist()
            feats = out.features[path]
            seq.drafter.observe(committed, feats, nxt)
            if seq.features is not None:
                seq.features.append(feats)
            seq.root, seq.last_tree = nxt, tree.size
            st = seq.stats
            st.time_draft += t_draft + time.perf_counter() - t0
            st.time_verify += t_verify
            st.target_forwards += 1
            st.accept_lengths.append(len(path))
            st.tree_sizes.append(tree.size)
            new = self._emit(seq, committed[1:] + [nxt])
            if seq.logprobs is not None:  # path node i's logits chose the token after it
                st.logprobs += token_logprobs(out.logits[path], new, seq.logprobs)
            results.append((seq, new))
        wall = time.perf_counter() - t_round
        self.head_batch.record(wall, sum(len(p) for p, _ in accepted))
        most = max(left)  # the rows the batch waits for at the end: the fewest accepted drafts among them counts
        tail_drafts = min(len(p) - 1 for (p, _), n in zip(accepted, left) if n == most)
        self.policy.record(len(rows), drafting, sum(len(p) for p, _ in accepted), wall, measured=not self._joined,
                           drafting=t_drafting, extra_verify=extra_verify, kind=kind, tail_drafts=tail_drafts,
                           row_seconds=self._row_seconds(len(rows)))
        self._joined = False
        for seq in rows:  # every row waited for the whole round
            seq.stats.wall_time += wall
            seq.stats.time_other = max(0.0, seq.stats.wall_time - seq.stats.time_prefill - seq.stats.time_draft
                                       - seq.stats.time_verify)
        self._drop_finished()
        return ended + results


def pack_counts(ranked: list[list[float] | None], sizes: list[int], expected: list[float], verify,
                per_node: list[float]) -> list[int]:
    """Per row, how many of its ranked draft nodes a batched round verifies: of every row's nodes, the ``n`` likeliest
    to be accepted (net of their own attention's cost), for the ``n`` where the round's expected tokens per second
    peaks (0: roots only). ``ranked[r]``:
    row r's nodes' acceptance estimates, best first (a parent before its children), or None: its tree, ``sizes[r]``
    tokens with its root and ``expected[r]`` expected accepted drafts, is verified whole. ``verify(t)``: the round's
    forward over t tokens; ``per_node[r]``: what each of row r's nodes adds to it (attention over its context)."""
    base = sum(1 if r is not None else n for r, n in zip(ranked, sizes))
    gains = float(len(sizes)) + sum(e for r, e in zip(ranked, expected) if r is None)
    best, best_rate, spent = 0, gains / verify(base), 0.0
    # likeliest first, net of what a node's own attention costs at the round's rate (a row over a long context pays
    # more per node); within a row that keeps its order, so each row's share is a prefix of its ranking
    offers = sorted(((p, row) for row, r in enumerate(ranked) if r is not None for p in r),
                    key=lambda o: best_rate * per_node[o[1]] - o[0])
    for n, (p, row) in enumerate(offers, 1):
        gains += p
        spent += per_node[row]
        rate = gains / (verify(base + n) + spent)
        if rate > best_rate:
            best, best_rate = n, rate
    counts = [0] * len(sizes)
    for _, row in offers[:best]:
        counts[row] += 1
    return counts


def decode_batch(target: BatchTarget, seqs: list[Sequence], cost: CostModel | None = None,
                 max_rows: int | None = None, on_tokens=None, policy: DraftOrPlain | None = None) -> list[Sequence]:
    """Decode every sequence to the end, at most ``max_rows`` at a time (newcomers join between rounds).

    ``on_tokens(seq, new_tokens)`` is called after each step of each sequence (streaming)."""
    dec = BatchDecoder(target, cost, policy)
    waiting = list(seqs)
    limit = max_rows or len(seqs)
    while waiting or dec.rows:
        joining, waiting = waiting[: max(0, limit - dec.rows)], waiting[max(0, limit - dec.rows):]
        dec.waiting = len(waiting)
        for seq, new in zip(joining, dec.add_many(joining)):
            if on_tokens is not None and new is not None:  # None: joins in a later round (admission.py)
                on_tokens(seq, new)
        for seq, new in dec.step():
            if on_tokens is not None:
                on_tokens(seq, new)
    return seqs
