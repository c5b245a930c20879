"""Tree verification for several sequences in one forward of a stock `transformers` model.

Rows live side by side in one KV cache ``[rows, heads, slots, dim]``. Row r's committed tokens are always the
prefix ``[0, lens[r])`` of its slots; everything after it is masked out (stale tree slots or zero padding). A
round packs every row's tree into one sequence (the linear layers see each row's real nodes, no padding) and
writes row r's tree right after its own prefix, slots ``[lens[r], lens[r] + size)``, with per-row 4-D masks
(past prefix + ancestors) and per-row positions (``lens[r] + depth``), so each row's keys are one contiguous
prefix of its slots and runs of rows of similar length and tree size attend over their own prefix only
(the attention kernel, one call per layer; elsewhere ``attention.row_runs``), not over the longest row's. Committing
moves each row's accepted path to the end of its own prefix (nothing moves when it is a chain from the root),
so rows of different lengths and accepted lengths share one cache without copies of the past. Newcomers are
prefilled together in one forward of their packed prompts (each attends causally over itself only; the linear layers
see all their tokens at once, where a short prompt alone runs far below the GEMM's peak) and join as new rows
between rounds.
"""

from __future__ import annotations

import os
import sys

import torch

from drafttree.attention import PackedRows, PromptRows, RowRun, kernel_for, row_runs
from drafttree.batching.prefix_pool import PrefixEntry, PrefixPool
from drafttree.cache import GrowingCache, cache_arg
from drafttree.errors import DraftTreeError
from drafttree.kernels.gemm import MAX_ROWS, kernel_rows
from drafttree.target import ONE_ROW_MODELS, ForwardOutput, TargetModel, common_prefix, run_with_features, tree_refusal
from drafttree.tree import DraftTree


def batch_invariant_default() -> bool:
    """$DRAFTTREE_BATCH_INVARIANT (1/on/true/yes), for :class:`BatchTarget`'s ``batch_invariant``."""
    return os.environ.get("DRAFTTREE_BATCH_INVARIANT", "").strip().lower() in ("1", "on", "true", "yes")


def _kernel_rows_of(sizes: list[int], packed: list[int] | None = None) -> torch.Tensor:
    """Per packed row, whether its part (a prompt, a tree) has at most MAX_ROWS rows: the rows gemm.kernel_rows gives
    to the small-GEMM kernel, as that part alone would take it (``packed``: each part's rows in the forward, where
    fewer than its size: a prompt's rest after a shared prefix)."""
    return torch.repeat_interleave(torch.tensor([m <= MAX_ROWS for m in sizes]), torch.tensor(packed or sizes))


def shared_prefixes(prompts: list[list[int] | None], at_least: int, kinds: list | None = None,
                    start: int = 0) -> list[tuple[int, int]]:
    """Per prompt from ``start`` on, (the earlier prompt it shares its longest prefix with, how many tokens), at most
    all of it but its last token (whose logits are the prefill's output); (-1, 0) where no earlier prompt shares
    ``at_least`` tokens. ``kinds``: prompts share only with prompts of the same kind (whose products take the same
    path); a prompt that is None (a row whose states cannot be shared) shares with none."""
    out: list[tuple[int, int]] = []
    for i in range(start, len(prompts)):
        ids, best = prompts[i], (-1, 0)
        for j in range(i):
            if prompts[j] is None or (kinds is not None and kinds[j] != kinds[i]):
                continue
            n = min(common_prefix(ids, prompts[j]), len(ids) - 1)
            if n > best[1]:
                best = (j, n)
        out.append(best if best[1] >= max(1, at_least) else (-1, 0))
    return out


def attends_rows(model: torch.nn.Module) -> bool:
    """Whether the model's attention goes through transformers' attention interface, where each row of a packed batch
    attends over its own slots. Not so for XGLM, GPT-NeoX-Japanese, ...: their own code takes one row at a time; nor
    for Doge (target.ONE_ROW_MODELS)."""
    if getattr(model.config, "model_type", None) in ONE_ROW_MODELS:
        return False
    modeling = sys.modules.get(type(model).__module__)
    return modeling is None or hasattr(modeling, "ALL_ATTENTION_FUNCTIONS")


class BatchTarget:
    """Prefill, batched tree forward, ragged commit and row removal over a shared cache."""

    def __init__(self, model: torch.nn.Module, feature_layers: list[int] | None = None,
                 batch_invariant: bool | None = None, prefix_pool: PrefixPool | None = None):
        """``batch_invariant`` (default: $DRAFTTREE_BATCH_INVARIANT): in bf16 too, a prompt packed with others and a
        tree in a round of more than 64 tokens get the bits they get alone, so a request's greedy text never depends
        on what else is being served (gemm.kernel_rows: their products go through the small-GEMM kernel 64 rows
        at a time, as alone; 5-11% of a 16-user burst here). Off, such rows take the many-row path, whose bf16 rounding
        differs (a short prompt's logits by up to ~0.7) and, now and then, so does a greedy text.

        ``prefix_pool``: rows that leave are kept there (:meth:`remember`) and a newcomer that begins as one of them
        did starts from a copy of its states (prefix caching; ``last_reused`` says how many tokens each one kept)."""
        self.pool = prefix_pool
        # prefills newcomers; holds config, LM head, masks
        why = tree_refusal(model)
        if why:
            kind = getattr(model.config, "model_type", type(model).__name__)
            raise DraftTreeError(f"{kind}: {why}; it decodes one sequence at a time (chains), not in batches")
        self.single = TargetModel(model, feature_layers, keep_prefix=prefix_pool is not None)
        # rows at most: 1 where the model's attention takes no packed rows (callers then decode one prompt at a time)
        self.max_rows: int | None = None if attends_rows(model) else 1
        self.last_reused: list[int] = []  # per prompt of the last add / add_many: tokens taken from the pool
        # prompts prefilled together that begin alike (a chat template's system prompt) compute their common prefix
        # once, copied into each row (SHARE_AT_LEAST tokens or more; 0: never); last_shared: each one's copied tokens
        self.share_at_least = self.SHARE_AT_LEAST
        self.last_shared: list[int] = []
        # per row: its prompt's ids and prefill features (a view of its prefill's output, not a copy), which a
        # newcomer that begins the same way takes; None where they are not all there (a pool hit)
        self.row_prompts: list[tuple[list[int], torch.Tensor] | None] = []
        self.batch_invariant = batch_invariant_default() if batch_invariant is None else bool(batch_invariant)
        self.model = model
        self.feature_layers = self.single.feature_layers
        self.cache: GrowingCache | None = None
        self.lens: list[int] = []
        self.segment_overhead = 512  # what one more attention call costs, in slot-reads (see _runs)
        self.query_cost = 0.25  # one more query per row, relative to reading the row's keys (CPU, float32)
        self.last_logits: torch.Tensor | None = None  # the last forward_trees' logits, every row's nodes in order

    # ---- what the decode loop reads -----------------------------------------------------------------
    @property
    def rows(self) -> int:
        return len(self.lens)

    @property
    def device(self) -> torch.device:
        return self.single.device

    @property
    def max_positions(self) -> int:
        return self.single.max_positions

    def _slots(self) -> int:
        return self.cache.layers[0].get_seq_length() if self.cache is not None and self.cache.layers else 0

    # ---- rows ---------------------------------------------------------------------------------------
    ROOM_AT_MOST = 1024  # slots reserved per row for its generation at most (a longer one grows the cache later)
    TREE_ROOM = 128  # ... plus a round's tree

    def _room(self, lens: list[int], room: list[int] | None) -> tuple[int, int]:
        """(rows, slots) the shared cache should hold once these prompts join, with ``room`` new tokens each."""
        room = room or [0] * len(lens)
        slots = max(n + min(r, self.ROOM_AT_MOST) + self.TREE_ROOM for n, r in zip(lens, room))
        return self.rows + len(lens), min(slots, self.max_positions + self.TREE_ROOM)

    @torch.inference_mode()
    def add(self, prompt_ids: torch.Tensor, room: int = 0, _for: tuple[int, int] | None = None) -> ForwardOutput:
        """Prefill one prompt alone and append it as the last row; returns its prefill output. ``room``: the new
        tokens it may generate (the cache is sized for them now rather than grown while the batch decodes)."""
        ids = prompt_ids.reshape(-1)
        hit = self.pool.best(ids.tolist()) if self.pool is not None else None
        out = self._add_one(ids, room, _for, hit)
        self.last_reused, self.last_shared = [0 if hit is None else hit[1]], [0]
        return out

    def _add_one(self, ids: torch.Tensor, room: int, need: tuple[int, int] | None,
                 hit: tuple[PrefixEntry, int] | None) -> ForwardOutput:
        """Prefill one prompt alone (on a copy of the pool entry's first ``p`` states for a ``hit``) as the last row."""
        try:
            if hit is not None:
                entry, p = hit
                self.single.load_prefix(entry.ids[:p], entry.states, entry.features, room=ids.numel() - p)
            out = self.single.prefill(ids)
            self._append_row(self.single, ids.tolist() if hit is None else None, out.features, room, need)
        finally:
            self.single.forget()  # what a newcomer's prefill leaves behind is never another's prefix
        return out

    def _append_row(self, single: TargetModel, ids: list[int] | None, features: torch.Tensor, room: int,
                    need: tuple[int, int] | None = None) -> None:
        """``single``'s sequence (its prompt's ids and features; None: not all of them there) as the last row."""
        self._check_rows(1)
        rows_for, slots_for = need or self._room([single.length], [room])
        if self.cache is None:
            self.cache = GrowingCache()
        self.cache.add_row(single.cache, rows_for=rows_for, slots_for=slots_for)
        self.lens.append(single.length)
        self.row_prompts.append(None if ids is None else (ids, features))

    @torch.inference_mode()
    def add_prefilled(self, single: TargetModel, out: ForwardOutput, room: int = 0, shared: bool = True
                      ) -> ForwardOutput:
        """Append a prompt prefilled on a cache of its own (``single``, whose prefill gave ``out``: a prompt prefilled
        a chunk at a time beside the batch, see admission.py) as the last row; returns ``out``, as :meth:`add`.
        ``shared``: newcomers may take its prefix (False for one that began as a pool entry, as :meth:`add`)."""
        ids = list(single.prefix.ids) if shared and single.prefix is not None else None
        self._append_row(single, ids, out.features, room)
        self.last_reused, self.last_shared = [0], [0]
        return out

    @torch.inference_mode()
    def remember(self, row: int, ids: list[int], features: torch.Tensor) -> None:
        """Keep row ``row``'s states for newcomers that begin as it does (``ids``: the tokens its cache holds, at
        most; ``features``: theirs, in order). Without a pool, nothing."""
        if self.pool is None or self.cache is None:
            return
        n = min(len(ids), self.lens[row], features.shape[0])
        if n < self.pool.min_match:
            return
        states = [layer.row_states(row, n) for layer in self.cache.layers]
        self.pool.add(PrefixEntry(list(ids[:n]), states, features[:n].clone()))

    MAX_PACKED_TOKENS = 4096  # a packed prefill's tokens at most (its activations; a longer batch is split)
    SHARE_AT_LEAST = 8  # shared prefix tokens for a packed prompt to take them from an earlier one

    def packs_prompts(self) -> bool:
        """Whether prompts can be prefilled together here: SDPA attention (the prompt-rows hook runs inside it)
        and no sliding-window layers (each prompt's window would need a mask of its own)."""
        return not self.single.has_sliding and getattr(self.model.config, "_attn_implementation", None) == "sdpa"

    @torch.inference_mode()
    def add_many(self, prompts: list[torch.Tensor], room: list[int] | None = None) -> list[ForwardOutput]:
        """Prefill several prompts and append them as rows, in order; returns each one's prefill output, as
        :meth:`add` would (``room``: each one's new tokens at most). Packed in forwards of up to
        ``MAX_PACKED_TOKENS`` tokens where :meth:`packs_prompts`, one at a time otherwise. A prompt that :meth:`add`
        would refuse raises its error before any row is added."""
        ids = [p.reshape(-1).to(self.device) for p in prompts]
        for x in ids:
            self.single.check_prompt(x.numel())
        need = self._room([x.numel() for x in ids], room)  # one cache size for all of them
        hits = [self.pool.best(x.tolist()) if self.pool is not None else None for x in ids]
        self.last_reused = [0 if h is None else h[1] for h in hits]
        self.last_shared = []
        if not self.packs_prompts():
            self.last_shared = [0] * len(ids)
            return [self._add_one(x, 0, need, h) for x, h in zip(ids, hits)]
        outs: list[ForwardOutput] = []
        group: list[torch.Tensor] = []
        for x, hit in zip(ids, hits):  # rows join in prompt order: a pool hit alone, the others packed
            if group and (hit is not None or sum(g.numel() for g in group) + x.numel() > self.MAX_PACKED_TOKENS):
                outs += self._prefill_group(group, need)
                group = []
            if hit is not None:
                self.last_shared.append(0)
                outs.append(self._add_one(x, 0, need, hit))
            else:
                group.append(x)
        return outs + (self._prefill_group(group, need) if group else [])

    def _prefill_group(self, ids: list[torch.Tensor], need: tuple[int, int]) -> list[ForwardOutput]:
        """One packed forward for the group; a lone prompt that shares no prefix with a row is prefilled alone."""
        if len(ids) == 1 and not self._shares(ids)[0][1]:
            self.last_shared.append(0)
            return [self._add_one(ids[0], 0, need, None)]
        return self._prefill_packed(ids, need)

    def _shares(self, ids: list[torch.Tensor]) -> list[tuple[int, int]]:
        """Per newcomer, (the row it takes its first states from, how many): a row in the batch or an earlier
        newcomer (rows + its index) that begins the same way, as :func:`shared_prefixes` finds them."""
        if not self.share_at_least:
            return [(-1, 0)] * len(ids)
        known = [None if r is None else r[0] for r in self.row_prompts]
        prompts = known + [x.tolist() for x in ids]
        # batch-invariant: a prompt takes the states of one whose products go the same way (see _kernel_rows_of)
        kinds = [p is not None and len(p) <= MAX_ROWS for p in prompts] if self.batch_invariant else None
        return shared_prefixes(prompts, self.share_at_least, kinds, start=len(known))

    def _check_rows(self, joining: int) -> None:
        if self.max_rows is not None and self.rows + joining > self.max_rows:
            kind = getattr(self.model.config, "model_type", type(self.model).__name__)
            raise DraftTreeError(f"{kind} decodes {self.max_rows} prompt(s) at a time (its attention does not go "
                                 "through transformers' attention interface), and the batch is full")

    def _prefill_packed(self, ids: list[torch.Tensor], need: tuple[int, int]) -> list[ForwardOutput]:
        self._check_rows(len(ids))
        # a prompt that begins as a row in the batch or an earlier newcomer computes only its rest: its row's first
        # slots are a copy of the other row's, made in each layer right after the forward writes them (the rest
        # attends over them)
        shares = self._shares(ids)
        dev, lens = self.device, [x.numel() for x in ids]
        rest = [n - p for n, (_, p) in zip(lens, shares)]
        self.last_shared += [p for _, p in shares]
        starts = [0]
        for n in rest:
            starts.append(starts[-1] + n)
        positions = torch.cat([torch.arange(p, n, device=dev) for n, (_, p) in zip(lens, shares)])[None]
        # the prompts' states go straight to the rows they will decode in, after the batch's rows (no prompt cache
        # copied row by row: at 64 users that and its buffers were ~a quarter of the prefill)
        first = self.rows
        row = first + torch.repeat_interleave(torch.arange(len(ids), device=dev), torch.tensor(rest, device=dev))
        copies = [(j, first + i, p) for i, (j, p) in enumerate(shares) if p]
        if self.cache is None:
            self.cache = GrowingCache()
        cache, length = self.cache, self._slots()
        cache.join_rows(self.model.config.num_hidden_layers, first + len(ids), *need)
        cache.set_scatter(row[None], positions, max(lens), copies)
        try:
            short = _kernel_rows_of(lens, rest) if self.batch_invariant else None
            prompts = PromptRows(starts, first, lens if copies else None)
            tokens = torch.cat([x[p:] for x, (_, p) in zip(ids, shares)])[None]
            with row_runs(None, None, prompts), kernel_rows(short, sum(rest)):
                out, aux = run_with_features(self.model, self.feature_layers, input_ids=tokens,
                                             attention_mask=None, position_ids=positions, use_cache=True,
                                             **{cache_arg(self.model.base_model): cache})
        except BaseException:
            cache.close_rows(first, length)  # the rows before keep their states; the newcomers never joined
            if not first:
                self.cache = None
            raise
        finally:
            cache.set_scatter(None)
        hidden = out.last_hidden_state[0]
        feats = hidden if aux is None else aux[0]
        logits = self.single.logits(hidden[[b - 1 for b in starts[1:]]])
        full: list[torch.Tensor] = []  # each prompt's features, the shared prefix's from the row it copied
        for x, (a, b), (j, p) in zip(ids, zip(starts, starts[1:]), shares):
            full.append(feats[a:b] if not p else torch.cat([self.row_prompts[j][1][:p], feats[a:b]]))
            self.lens.append(x.numel())
            self.row_prompts.append((x.tolist(), full[-1]))
        return [ForwardOutput(logits=logits[r:r + 1], features=f) for r, f in enumerate(full)]

    @torch.inference_mode()
    def keep(self, rows: list[int]) -> None:
        """Keep only these rows (in this order); finished or cancelled rows free their slots."""
        if rows == list(range(self.rows)):
            return
        self.lens = [self.lens[r] for r in rows]
        self.row_prompts = [self.row_prompts[r] for r in rows]
        if not rows:
            # the buffers stay for the next batch (as a server's KV cache does): a new one of a burst's size is
            # first-touch pages, zero-filled, ~7% of a 16-user packed prefill here; what a new row finds in its slots
            # is masked out, as after any row leaves. forget_buffers() frees them
            if self.cache is not None:
                self.cache.empty()
            return
        self.cache.select_rows(list(rows))
        self._truncate()

    def forget_buffers(self) -> None:
        """Free the cache's buffers once no row is left (they are kept for the next batch otherwise)."""
        if not self.rows:
            self.cache = None

    def _truncate(self) -> None:
        for layer in self.cache.layers:
            layer.truncate(max(self.lens))

    # ---- one round ----------------------------------------------------------------------------------
    def _mask_and_positions(self, trees: list[DraftTree], n: int):
        rows, dev, dtype = self.rows, self.device, self.single.dtype
        lens = torch.tensor(self.lens, dtype=torch.long, device=dev)
        slots = max(self.lens) + n  # from the host list: no device sync
        depth = torch.zeros(rows, n, dtype=torch.long, device=dev)
        tree_part = torch.zeros(rows, n, n, dtype=torch.bool, device=dev)
        eye = torch.eye(n, dtype=torch.bool, device=dev)
        for r, t in enumerate(trees):
            m = t.size
            depth[r, :m] = t.depths.to(dev)
            tree_part[r, :m, :m] = t.ancestors.to(dev)
            tree_part[r, m:] = eye[m:]  # padding attends to itself only (its output is never read)
        key = torch.arange(slots, device=dev)
        allowed = (key[None, None, :] < lens[:, None, None]).expand(rows, n, slots).clone()
        tree_slots = lens[:, None] + torch.arange(n, device=dev)[None, :]  # [rows, n]
        row = torch.arange(rows, device=dev)[:, None].expand(rows, n)
        allowed.transpose(1, 2)[row, tree_slots] = tree_part.transpose(1, 2)  # key slot lens[r] + j: node j
        positions = lens[:, None] + depth
        masks = {"full_attention": allowed}
        if self.single.has_sliding:
            key_pos = key.expand(rows, slots).clone()
            key_pos[row, tree_slots] = positions
            near = (positions[:, :, None] - key_pos[:, None, :]) < self.single.sliding_window
            masks["sliding_attention"] = allowed & near
        additive = {}
        for kind, ok in masks.items():
            m = torch.zeros(ok.shape, dtype=dtype, device=dev)
            additive[kind] = m.masked_fill_(~ok, torch.finfo(dtype).min)[:, None]
        return (additive if self.single.has_sliding else additive["full_attention"]), positions

    def _runs(self, sizes: list[int]) -> list[RowRun]:
        """Runs of consecutive rows attended together: the split that minimises the attention work, each row
        costing its run's (longest row + widest tree) slots times ``1 + query_cost`` per query of the run's width,
        plus ``segment_overhead`` per extra attention call."""
        lens, rows, overhead, qc = self.lens, self.rows, self.segment_overhead, self.query_cost
        best = [0.0] + [float("inf")] * rows
        cut = [0] * (rows + 1)
        for b in range(1, rows + 1):
            longest = width = 0
            for a in range(b - 1, -1, -1):
                longest, width = max(longest, lens[a]), max(width, sizes[a])
                cost = best[a] + (b - a) * (longest + width) * (1 + qc * width) + overhead
                if cost < best[b]:
                    best[b], cut[b] = cost, a
        bounds, b = [], rows
        while b > 0:
            bounds.append((cut[b], b))
            b = cut[b]
        starts = [0]
        for m in sizes:
            starts.append(starts[-1] + m)
        runs = []
        for a, b in bounds[::-1]:
            width = max(sizes[a:b])
            grid = pad = None
            if any(m != width for m in sizes[a:b]):
                grid = torch.cat([torch.arange(m) + (r - a) * width for r, m in zip(range(a, b), sizes[a:b])])
                pad = torch.cat([torch.arange(m, width) + (r - a) * width for r, m in zip(range(a, b), sizes[a:b])])
                grid, pad = grid.to(self.device), pad.to(self.device)
            runs.append(RowRun(a, b, max(lens[a:b]) + width, width, starts[a], starts[b], grid, pad))
        return runs

    @torch.inference_mode()
    def forward_trees(self, trees: list[DraftTree]) -> list[ForwardOutput]:
        """Verify one tree per row (row order) in a single forward; logits only for real nodes.

        The trees are packed into one sequence (the linear layers see each row's real nodes, not every row padded
        to the largest tree); attention spreads each run of rows on its own small grid (``attention.RowRun``)."""
        if len(trees) != self.rows or not trees:
            raise RuntimeError(f"{len(trees)} trees for {self.rows} rows")
        sizes = [t.size for t in trees]
        n, dev = max(sizes), self.device
        tokens = torch.cat([t.tokens.to(dev) for t in trees])[None]
        mask, positions = self._mask_and_positions(trees, n)
        row = torch.repeat_interleave(torch.arange(self.rows, device=dev), torch.tensor(sizes, device=dev))
        node = torch.cat([torch.arange(m, device=dev) for m in sizes])
        lens = torch.tensor(self.lens, dtype=torch.long, device=dev)
        self.cache.set_scatter(row[None], (lens[row] + node)[None], max(self.lens) + n)
        if kernel_for(dev, self.single.dtype) is not None:  # one kernel call per layer over the packed rows
            runs = None
            packed = PackedRows(self.rows, len(row), row, node, lens + torch.tensor(sizes, device=dev))
        else:
            runs, packed = self._runs(sizes), None
        # batch invariance: a round of more than MAX_ROWS tokens takes the kernel too (64 rows at a time), as each
        # row's tree does alone (the many-row path rounds otherwise)
        every = _kernel_rows_of(sizes) if self.batch_invariant else None
        try:
            with row_runs(runs, packed, sizes=sizes), kernel_rows(every, len(row)):
                out, aux = run_with_features(self.model, self.feature_layers, input_ids=tokens, attention_mask=mask,
                                             position_ids=positions[row, node][None], use_cache=True,
                                             **{cache_arg(self.model.base_model): self.cache})
        finally:
            self.cache.set_scatter(None)
        hidden = out.last_hidden_state[0]
        feats = hidden if aux is None else aux[0]
        with kernel_rows(every, len(row)):
            self.last_logits = logits = self.single.logits(hidden)
        return [ForwardOutput(logits=lg, features=f) for lg, f in zip(logits.split(sizes), feats.split(sizes))]

    @torch.inference_mode()
    def commit(self, paths: list[list[int]]) -> None:
        """Row r keeps its tree nodes ``paths[r]`` (root first) after its prefix; all other tree slots are dropped."""
        rows, src, dst = [], [], []
        for r, path in enumerate(paths):
            if path != list(range(len(path))):  # a chain from the root already sits where it belongs
                rows += [r] * len(path)
                src += [self.lens[r] + p for p in path]
                dst += range(self.lens[r], self.lens[r] + len(path))
            self.lens[r] += len(path)
        if rows:
            idx = [torch.tensor(x, dtype=torch.long, device=self.device) for x in (rows, src, dst)]
            for layer in self.cache.layers:
                layer.move_slots(*idx)
        self._truncate()

    def check_room(self, row: int) -> bool:
        """Whether row ``row`` can take one more token within the context window."""
        if row >= self.rows:
            raise DraftTreeError(f"no row {row}")
        return self.lens[row] + 1 < self.max_positions
