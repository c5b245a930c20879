"""A KV cache that appends in place.

transformers' ``DynamicLayer`` concatenates the whole cache with every new token (``torch.cat``), so each
forward copies all keys and values: for a batch of 48 self-distillation sequences that is hundreds of MB
per step, and a few ms per step even at batch size 1. ``GrowingLayer`` keeps a buffer with spare room
(doubling when full), writes new states into it and hands out views; cropping only moves the length.
It is a drop-in ``DynamicCache`` (transformers' ``generate`` accepts it as ``past_key_values``).
"""

from __future__ import annotations

import functools
import inspect
import math
import mmap

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


def cache_arg(module: torch.nn.Module) -> str:
    """The keyword under which ``module``'s forward takes its KV cache: transformers 5.24 renamed ``past_key_values``
    to ``cache`` (the old name warns, and is removed in 5.40); earlier 5.x versions only know the old one."""
    return _cache_arg(type(module))


@functools.cache
def _cache_arg(cls: type) -> str:
    try:
        params = inspect.signature(cls.forward).parameters  # follows the deprecation wrapper's __wrapped__
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


LAZY_BYTES = 1 << 20  # CPU buffers from this size on are zero pages the OS maps in as they are first touched


def zeros(like: torch.Tensor, *shape: int) -> torch.Tensor:
    """A zero-filled buffer of ``like``'s dtype and device. On the CPU a large one is an anonymous private mapping
    (zero pages that cost nothing until touched): a batch's cache holds every row at the longest row's length, and
    touching all of it cost a burst of 64 users (one 1,157-token prompt among them) 2.2 s of zeroing, ~10% of the burst,
    for slots that short rows never use."""
    nbytes = math.prod(shape) * like.element_size()
    if like.device.type != "cpu" or nbytes < LAZY_BYTES:
        return like.new_zeros(shape)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buf, dtype=like.dtype).view(shape)  # the tensor keeps the mapping alive


class GrowingLayer(DynamicLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._len = 0
        self._rows: int | None = None  # a batch: rows in use (the buffer has room for more); None: all of them
        # set by a batch: the (row, slot) each new state goes to, shaped like the forward's [batch, tokens]
        self.scatter: tuple[torch.Tensor, torch.Tensor] | None = None
        self.row_end = 0  # ... and the slot after the last of them (a host int: no device sync per layer)
        # ... and (from row, to row, slots): after the scatter, to row's first slots become a copy of from row's (a
        # packed prefill's prompts that begin as an earlier one did compute only their rest; in order: chains work)
        self.copies: list[tuple[int, int, int]] = []
        # (rows in use after, rows to have room for, slots to have room for): rows that the next scattered forward
        # fills at the end of a batch's cache (a packed prefill of newcomers, written where they will decode)
        self.joining: tuple[int, int, int] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.scatter is not None:
            return self._update_rows(key_states, value_states)
        n = key_states.shape[-2]
        need = self._len + n
        self._reserve(key_states, value_states, need)
        self._k[..., self._len:need, :] = key_states
        self._v[..., self._len:need, :] = value_states
        self._len = need
        self._set_views()
        return self.keys, self.values

    def _update_rows(self, key_states: torch.Tensor, value_states: torch.Tensor):
        """New state ``[b, :, t]`` goes to row ``index[b, t]``, slot ``slots[b, t]``: a batch writes each row's
        tree right after its own prefix, so each row's keys are one contiguous prefix of its slots (runs of rows
        attend over their own). The forward may hold one row per batch entry or all rows' trees packed in one."""
        index, slots = self.scatter
        need = max(self._len, self.row_end)
        if self.joining is not None:
            self._open_rows(key_states, value_states, need)
        if self._k is None:
            raise RuntimeError("a batched forward scatters into rows added before it (add_row)")
        self._reserve(self._k[..., :0, :], self._v[..., :0, :], need)
        self._k[index, :, slots] = key_states.transpose(1, 2)  # [b, t, heads, dim] at (row, slot)
        self._v[index, :, slots] = value_states.transpose(1, 2)
        for src, dst, n in self.copies:
            self._k[dst, :, :n] = self._k[src, :, :n]
            self._v[dst, :, :n] = self._v[src, :, :n]
        self._len = need
        self._set_views()
        return self.keys, self.values

    def _open_rows(self, key_states: torch.Tensor, value_states: torch.Tensor, need: int) -> None:
        """Put the joining rows in use, with room for ``joining``'s rows and slots (one new buffer, zeros, only when
        the old one is too small: rows in use keep their states)."""
        after, rows_for, slots_for = self.joining
        self.joining = None
        rows = 0 if self._k is None else (self._k.shape[0] if self._rows is None else self._rows)
        if self._k is None or after > self._k.shape[0] or max(need, slots_for) > self._k.shape[-2]:
            cap_rows = max(after, rows_for, 0 if self._k is None else self._k.shape[0])
            cap = max(need, slots_for, 0 if self._k is None else self._k.shape[-2])
            heads, dim, vdim = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
            nk, nv = zeros(key_states, cap_rows, heads, cap, dim), zeros(value_states, cap_rows, heads, cap, vdim)
            if rows and self._len:
                nk[:rows, ..., : self._len, :] = self._k[:rows, ..., : self._len, :]
                nv[:rows, ..., : self._len, :] = self._v[:rows, ..., : self._len, :]
            self._k, self._v = nk, nv
        self._rows = after

    def _set_views(self) -> None:
        k, v = (self._k, self._v) if self._rows is None else (self._k[: self._rows], self._v[: self._rows])
        self.keys, self.values = k[..., : self._len, :], v[..., : self._len, :]

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, need: int) -> None:
        if self._k is None or need > self._k.shape[-2] or self._k.shape[0] != key_states.shape[0]:
            cap = max(need + 64, 2 * (self._k.shape[-2] if self._k is not None else 128))
            # zeros: a batch's masked slots may be read (scores of garbage could be NaN, even when masked)
            k = zeros(key_states, *key_states.shape[:-2], cap, key_states.shape[-1])
            v = zeros(value_states, *value_states.shape[:-2], cap, value_states.shape[-1])
            if self._k is not None and self._len:
                k[..., : self._len, :] = self._k[..., : self._len, :]
                v[..., : self._len, :] = self._v[..., : self._len, :]
            self._k, self._v = k, v

    def get_seq_length(self) -> int:
        return self._len

    def load(self, keys: torch.Tensor, values: torch.Tensor, room: int = 0) -> None:
        """Start from a copy of these states ([heads, n, dim], one sequence), with room for ``room`` more."""
        k, v = keys[None], values[None]
        if not self.is_initialized:
            self.lazy_initialization(k, v)
        n = k.shape[-2]
        self._k = zeros(k, *k.shape[:-2], n + room + 64, k.shape[-1])
        self._v = zeros(v, *v.shape[:-2], n + room + 64, v.shape[-1])
        self._k[..., :n, :], self._v[..., :n, :] = k, v
        self._len, self._rows = n, None
        self._set_views()

    def row_states(self, row: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of row ``row``'s first ``length`` keys and values ([heads, length, dim])."""
        return self._k[row, ..., :length, :].clone(), self._v[row, ..., :length, :].clone()

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions (the buffer stays allocated)."""
        if self._k is None or length >= self._len:
            return
        self._len = max(0, length)
        self._set_views()

    def crop(self, max_length: int) -> None:
        if max_length < 0:  # transformers' convention: a negative value removes that many tokens
            max_length = self._len + max_length
        self.truncate(max_length)

    def reset(self) -> None:
        self._k = self._v = None
        self._len, self._rows = 0, None
        super().reset()

    def select_rows(self, rows: torch.Tensor | list[int]) -> None:
        """Keep only these batch rows, in this order (batched generation drops finished sequences). A host list in
        which no row moves up (``rows[i] >= i``: ascending, or a removed row's place taken by a row from the end) is
        applied in place: only the rows that move, only their used slots, no new buffer."""
        if self._k is None:
            return
        if isinstance(rows, list) and len(set(rows)) == len(rows) and all(r >= i for i, r in enumerate(rows)):
            for i, r in enumerate(rows):
                if i != r:
                    self._k[i, ..., : self._len, :] = self._k[r, ..., : self._len, :]
                    self._v[i, ..., : self._len, :] = self._v[r, ..., : self._len, :]
            self._rows = len(rows)
        else:
            live = slice(None) if self._rows is None else slice(0, self._rows)
            self._k, self._v, self._rows = self._k[live][rows], self._v[live][rows], None
        self._set_views()

    def add_row(self, other: GrowingLayer, row: int = 0, length: int | None = None, rows_for: int = 0,
                slots_for: int = 0) -> None:
        """Append ``other``'s row ``row`` (its first ``length`` slots; default: its single sequence) as a new batch
        row. The buffer keeps room for more rows (doubling), so a stream of newcomers reallocates it only now and
        then; slots past a row's length are masked out by the caller (they hold zeros or an earlier row's states:
        finite either way). A buffer made here has room for at least ``rows_for`` rows of ``slots_for`` slots
        (what the caller knows it will need: rows joining together, their generations), so that decoding does not
        grow it, a copy of every row's states that took ~10% of a burst of 64 users' rounds."""
        n = other._len if length is None else length
        k, v = other._k[row:row + 1, ..., :n, :], other._v[row:row + 1, ..., :n, :]
        rows = 0 if self._k is None else (self._k.shape[0] if self._rows is None else self._rows)
        length = max(self._len, n)
        if self._k is None or rows + 1 > self._k.shape[0] or max(length, slots_for) > self._k.shape[-2]:
            cap_rows = max(rows + 1, 2 * rows, rows_for)
            cap = max(self._k.shape[-2] if self._k is not None else 0, length + 64, slots_for)
            nk = zeros(k, cap_rows, *k.shape[1:-2], cap, k.shape[-1])
            nv = zeros(v, cap_rows, *v.shape[1:-2], cap, v.shape[-1])
            if rows:
                nk[:rows, ..., : self._len, :] = self._k[:rows, ..., : self._len, :]
                nv[:rows, ..., : self._len, :] = self._v[:rows, ..., : self._len, :]
            self._k, self._v = nk, nv
        self._k[rows, ..., :n, :] = k[0]
        self._v[rows, ..., :n, :] = v[0]
        self._rows, self._len = rows + 1, length
        if not self.is_initialized:
            self.lazy_initialization(k, v)
        self._set_views()

    def move_slots(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slot ``src[i]`` of row ``rows[i]`` to slot ``dst[i]`` (all gathered before any is written)."""
        self._k[rows, :, dst] = self._k[rows, :, src]
        self._v[rows, :, dst] = self._v[rows, :, src]


class GrowingCache(DynamicCache):
    """A DynamicCache whose layers append in place (full attention layers only)."""

    def __init__(self):
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    def select_rows(self, rows: torch.Tensor | list[int]) -> None:
        for layer in self.layers:
            layer.select_rows(rows)

    @classmethod
    def of_states(cls, states: list[tuple[torch.Tensor, torch.Tensor]], room: int = 0) -> GrowingCache:
        """A one-sequence cache holding copies of these per-layer states ([heads, n, dim] each)."""
        cache = cls()
        for k, v in states:
            layer = GrowingLayer()
            layer.load(k, v, room)
            cache.layers.append(layer)
        return cache

    def set_scatter(self, index: torch.Tensor | None, slots: torch.Tensor | None = None, end: int = 0,
                    copies: list[tuple[int, int, int]] | None = None) -> None:
        """The row and slot of each state of the next forward (both shaped like its [batch, tokens]; None:
        appended after the longest row), ``end``, the slot after the last of them, and ``copies`` (from row, to row,
        slots) made after the scatter, in order."""
        for layer in self.layers:
            layer.scatter = None if index is None else (index, slots)
            layer.row_end = end
            layer.copies = list(copies or []) if index is not None else []

    def add_row(self, other: GrowingCache, row: int = 0, length: int | None = None, rows_for: int = 0,
                slots_for: int = 0) -> None:
        """Append row ``row`` of ``other`` (default: its single sequence) as a new batch row (see
        :meth:`GrowingLayer.add_row`)."""
        while len(self.layers) < len(other.layers):
            self.layers.append(GrowingLayer())
        for mine, theirs in zip(self.layers, other.layers):
            mine.add_row(theirs, row, length, rows_for, slots_for)

    def join_rows(self, layers: int, after: int, rows_for: int = 0, slots_for: int = 0) -> None:
        """The next scattered forward fills new rows at the end, ``after`` rows in use then (see
        :meth:`GrowingLayer._open_rows`); the buffer keeps room for ``rows_for`` rows of ``slots_for`` slots."""
        while len(self.layers) < layers:
            self.layers.append(GrowingLayer())
        for layer in self.layers:
            layer.joining = (after, rows_for, slots_for)

    def empty(self) -> None:
        """No row in use, the buffers kept: rows that join later take their slots (past a row's length, a slot holds
        an earlier row's states, finite and masked out)."""
        for layer in self.layers:
            if layer._k is not None:
                layer._rows, layer._len = 0, 0
                layer._set_views()

    def close_rows(self, rows: int, length: int) -> None:
        """Undo a :meth:`join_rows` whose forward failed: ``rows`` rows in use, ``length`` slots."""
        for layer in self.layers:
            layer.joining = None
            if layer._k is not None:
                layer._rows, layer._len = rows, min(layer._len, length)
                layer._set_views()
