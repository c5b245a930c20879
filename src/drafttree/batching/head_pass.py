"""The EAGLE heads of a batch's rows draft together: one packed head forward and one LM-head product per level.

Drafting one row at a time costs a batch rows x (head layer + draft LM head) per level, each read from memory
for each row, against one shared verification: in a batch the head could not pay, and batched rounds drafted
from context n-grams only. Here every row's tokens of a level go through the head in one packed forward (the
weights read once); each row keeps its own head cache and attends over it alone (:class:`RaggedCache` hands the
attention function per-row keys and masks). A round first encodes what each row committed last round, which
gives every row's root distribution (one LM-head product for all), then, level by level, drafts the likeliest
child of the rows whose chain is still likely enough to pay in this batch (calibrated probability over the
row's bar, the least acceptance at which any node pays this round). Each row's source turns what was drafted
into candidates: the top-k siblings at every level of its chain (:meth:`PreparedChain.candidates`).

Whether the pass runs at all is a :class:`~drafttree.drafters.hybrid.Gate` per batch size: the head-only tokens
the rows accepted against the pass's share of the round (measured: timings steer drafting, never the output).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from drafttree.attention import MAX_FOLDED_QUERY, grouped_attention
from drafttree.batching.policy import bucket
from drafttree.drafters.eagle import EagleState, HeadInput
from drafttree.kernels import fast_linears
from drafttree.tree import Candidates

CATCH_UP = 32  # tokens a row encodes beyond which its pass is a catch-up (see HeadBatch._draft_group)


class RaggedCache:
    """``past_key_values`` of a packed forward over rows whose caches are separate: row r's ``counts[r]`` new
    keys and values go to its own cache, and the attention function gets every row's full keys (lists)."""

    def __init__(self, caches: list, counts: list[int]):
        self.caches, self.counts = caches, counts

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = [], []
        for cache, k, v in zip(self.caches, key_states.split(self.counts, dim=2),
                               value_states.split(self.counts, dim=2)):
            kk, vv = cache.update(k, v, layer_idx)
            keys.append(kk)
            values.append(vv)
        return keys, values


def packs(head: torch.nn.Module) -> bool:
    """Whether this head's attention goes through drafttree's attention function (which takes ragged rows)."""
    return getattr(getattr(head, "config", None), "_attn_implementation", None) == "sdpa"


@torch.inference_mode()
def run_packed(head: torch.nn.Module, states: list[EagleState], inputs: list[HeadInput]) -> list[torch.Tensor]:
    """One head forward over several rows' inputs; returns each row's outputs (rows alone where it cannot pack)."""
    if len(states) == 1 or not packs(head):
        return [s._run(*i) for s, i in zip(states, inputs)]
    counts = [int(i.ids.numel()) for i in inputs]
    dtype = inputs[0].feats.dtype
    feats = torch.cat([i.feats.to(dtype) for i in inputs])[None]
    ids = torch.cat([i.ids for i in inputs])[None]
    positions = torch.cat([i.positions for i in inputs])[None]
    masks = [s.mask(i.attend, i.positions) for s, i in zip(states, inputs)]
    with grouped_attention(head), fast_linears(head):
        out = head(feats, ids, positions, masks, RaggedCache([s.cache for s in states], counts))
    return list(out[0].split(counts))


@dataclass
class PreparedChain:
    """What the batch pass drafted for one row: its root log-probs and, per level of its chain, the token
    expanded (the likeliest child of the level before) and its children's log-probs."""

    root_lp: torch.Tensor
    levels: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    def candidates(self, vocab_ids: torch.Tensor | None, top_k: int, max_depth: int, calibrate):
        """Candidates: the ``top_k`` children at each depth of the chain (``calibrate(raw, depth)`` gives their
        conditional acceptance log-probs), the first of each the parent of the next depth's."""
        toks, pars, conds, scores, raws = [], [], [], [], []
        lp, parent, parent_score, n = self.root_lp, -1, 0.0, 0
        depth = min(max_depth, len(self.levels) + 1)
        for d in range(1, depth + 1):
            vals, idx = lp.topk(min(top_k, lp.shape[-1]))
            raw = vals.clamp(max=0.0).float()
            cond = calibrate(raw, d)
            toks.append(idx if vocab_ids is None else vocab_ids[idx])
            pars.append(torch.full((idx.numel(),), parent, dtype=torch.long))
            conds.append(cond)
            scores.append(cond + parent_score)
            raws.append(raw)
            if d < depth:  # the child the pass expanded (ties may have put another first in this top-k)
                where = (toks[-1] == self.levels[d - 1][0]).nonzero()
                if where.numel() == 0:
                    n += idx.numel()
                    break
                j = int(where[0])
                parent, parent_score = n + j, float(scores[-1][j])
                lp = self.levels[d - 1][1]
            n += idx.numel()
        return Candidates(torch.cat(toks).cpu(), torch.cat(pars), torch.cat(conds).cpu(), torch.cat(scores).cpu(),
                          torch.cat(raws).cpu(), len(toks) - 1)


@dataclass
class HeadRow:
    """One row's part in a pass: its head source, the least acceptance that pays in this batch, how deep it may
    draft, and the drafter whose ``last_alone`` tells afterwards what the head alone gained it."""

    source: object  # a sources.model_sources.HeadSource
    bar: float
    max_depth: int
    drafter: object = None


class HeadBatch:
    """Drafts the heads of a batch's rows together (see the module doc); ``max_depth`` caps the chains."""

    def __init__(self, max_depth: int = 4):
        from drafttree.drafters.hybrid import Gate

        self.max_depth = int(max_depth)
        self.gate = Gate(probe=8, max_probe=64)
        self._last: tuple[list[HeadRow], float, int, bool] | None = None
        self._catching_up = False
        self.passes = 0  # rounds that drafted (diagnostics, tests)

    def draft(self, rows: list[HeadRow], batch_rows: int) -> float:
        """Draft for ``rows`` (each gets ``source.prepared``); returns the seconds spent (0 when gated off)."""
        rows = [r for r in rows if r.max_depth >= 1]
        self._last = None
        if not rows or not self.gate.allow(bucket(batch_rows)):
            return 0.0
        t0 = time.perf_counter()
        self._catching_up = False
        by_head: dict[int, list[HeadRow]] = {}
        for r in rows:
            by_head.setdefault(id(r.source.head), []).append(r)
        for group in by_head.values():
            self._draft_group(group)
        dev = rows[0].source.state.root_feat.device if rows[0].source.state.root_feat is not None else None
        if dev is not None and dev.type == "cuda":
            torch.cuda.synchronize(dev)
        spent = time.perf_counter() - t0
        self._last = (rows, spent, batch_rows, self._catching_up)
        self.passes += 1
        return spent

    def _draft_group(self, rows: list[HeadRow]) -> None:
        head = rows[0].source.head
        states = [r.source.ready_state() for r in rows]
        flush = [(s, s.flush_input()) for s in states]
        for s in states:
            if s.pending:
                s._crop()
        flush = [(s, i) for s, i in flush if i is not None]
        # a newcomer's prompt, or what rows committed while the gate was closed, is encoded once (as a lone
        # sequence's first draft does): a cost of joining or of probing, not of drafting, so such a round's gain is
        # weighed against the pass's usual cost, not this one
        self._catching_up |= any(int(i.ids.numel()) > CATCH_UP for _, i in flush)
        # a long backlog (a newcomer's prompt) is encoded alone, as a prefill (EagleState._run), the others packed
        for s, i in [(s, i) for s, i in flush if int(i.ids.numel()) > MAX_FOLDED_QUERY]:
            s.flush_output(s._run(*i, committed=True))
        flush = [(s, i) for s, i in flush if int(i.ids.numel()) <= MAX_FOLDED_QUERY]
        if flush:
            for (s, _), out in zip(flush, run_packed(head, [s for s, _ in flush], [i for _, i in flush])):
                s.flush_output(out)
        need = [s for s in states if s._root_lp is None]
        if need:
            lps = torch.log_softmax(head.draft_logits(torch.stack([s.root_feat for s in need])).float(), dim=-1)
            for s, lp in zip(need, lps):
                s._root_lp = lp
        preps = [PreparedChain(s._root_lp) for s in states]
        scores = [0.0] * len(rows)
        lps = [s._root_lp for s in states]
        live = list(range(len(rows)))
        for d in range(1, self.max_depth):
            going = []
            for j in live:
                r = rows[j]
                if d >= min(r.max_depth, r.source.depth):
                    continue
                raw = lps[j].max().clamp(max=0.0).reshape(1)
                scores[j] += float(r.source.calibrated(raw, d)[0])
                if scores[j] >= math.log(max(r.bar, 1e-9)):
                    going.append(j)
            live = going
            if not live:
                break
            inputs, toks = [], []
            for j in live:
                s = states[j]
                idx = int(lps[j].argmax())
                tok = idx if s.vocab_ids is None else int(s.vocab_ids[idx])
                toks.append(tok)
                attend = torch.ones(1, d, dtype=torch.bool, device=s.root_feat.device)  # its chain, and itself
                inputs.append(s.expand_input(torch.tensor([tok]), torch.tensor([d - 2]), attend, d))
            outs = run_packed(head, [states[j] for j in live], inputs)
            feats = torch.cat([states[j].expand_output(o) for j, o in zip(live, outs)])
            child = torch.log_softmax(head.draft_logits(feats).float(), dim=-1)
            for j, tok, lp in zip(live, toks, child):
                preps[j].levels.append((tok, lp))
                lps[j] = lp
        for r, p in zip(rows, preps):
            r.source.prepared = p

    def record(self, round_seconds: float, committed: int) -> None:
        """After the round: the rows' head-only accepted tokens against the pass's share of the round."""
        if self._last is None:
            return
        rows, spent, batch_rows, catching_up = self._last
        self._last = None
        gain = float(sum(getattr(r.drafter, "last_alone", {}).get(id(r.source), 0) for r in rows))
        situation = bucket(batch_rows)
        share = spent / max(1e-9, round_seconds - spent)
        if catching_up:
            share = self.gate.cost.get(situation)
            if share is None:  # nothing usual to go by yet: learn from the next round
                return
        self.gate.record(situation, gain, share, max(1.0, committed - gain))
