"""A KV cache that appends in place.

transformers' ``DynamicLayer`` concatenates the whole cache with every new token (``torch.cat``), so each
forward copies all keys and values: for a batch of 48 self-distillation sequences that is hundreds of MB
per step, and a few ms per step even at batch size 1. ``GrowingLayer`` keeps a buffer with spare room
(doubling when full), writes new states into it and hands out views; cropping only moves the length.
It is a drop-in ``DynamicCache`` (transformers' ``generate`` accepts it as ``past_key_values``).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._len = 0
        self.row_offsets: torch.Tensor | None = None  # set by a batch: where each row's new states go
        self.row_end = 0  # ... and the slot after the last of them (a host int: no device sync per layer)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.row_offsets is not None:
            return self._update_rows(key_states, value_states)
        n = key_states.shape[-2]
        need = self._len + n
        self._reserve(key_states, value_states, need)
        self._k[..., self._len:need, :] = key_states
        self._v[..., self._len:need, :] = value_states
        self._len = need
        self.keys = self._k[..., :need, :]
        self.values = self._v[..., :need, :]
        return self.keys, self.values

    def _update_rows(self, key_states: torch.Tensor, value_states: torch.Tensor):
        """Row r's n new states go to slots ``[row_offsets[r], row_offsets[r] + n)``, right after its own prefix,
        so each row's keys are one contiguous prefix of its slots (a batch attends row runs over their own)."""
        rows, n = key_states.shape[0], key_states.shape[-2]
        offsets = self.row_offsets.to(key_states.device)
        need = max(self._len, self.row_end)
        self._reserve(key_states, value_states, need)
        slots = offsets[:, None] + torch.arange(n, device=offsets.device)[None, :]
        index = torch.arange(rows, device=offsets.device)[:, None].expand(rows, n)
        self._k[index, :, slots] = key_states.transpose(1, 2)  # [rows, n, heads, dim] at (row, slot)
        self._v[index, :, slots] = value_states.transpose(1, 2)
        self._len = need
        self.keys = self._k[..., :need, :]
        self.values = self._v[..., :need, :]
        return self.keys, self.values

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, need: int) -> None:
        if self._k is None or need > self._k.shape[-2] or self._k.shape[0] != key_states.shape[0]:
            cap = max(need + 64, 2 * (self._k.shape[-2] if self._k is not None else 128))
            # zeros: a batch's masked slots may be read (scores of garbage could be NaN, even when masked)
            k = key_states.new_zeros(*key_states.shape[:-2], cap, key_states.shape[-1])
            v = value_states.new_zeros(*value_states.shape[:-2], cap, value_states.shape[-1])
            if self._k is not None and self._len:
                k[..., : self._len, :] = self._k[..., : self._len, :]
                v[..., : self._len, :] = self._v[..., : self._len, :]
            self._k, self._v = k, v

    def get_seq_length(self) -> int:
        return self._len

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions (the buffer stays allocated)."""
        if self._k is None or length >= self._len:
            return
        self._len = max(0, length)
        self.keys = self._k[..., : self._len, :]
        self.values = self._v[..., : self._len, :]

    def crop(self, max_length: int) -> None:
        if max_length < 0:  # transformers' convention: a negative value removes that many tokens
            max_length = self._len + max_length
        self.truncate(max_length)

    def reset(self) -> None:
        self._k = self._v = None
        self._len = 0
        super().reset()

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (batched generation drops finished sequences)."""
        if self._k is None:
            return
        self._k, self._v = self._k[rows], self._v[rows]
        self.keys = self._k[..., : self._len, :]
        self.values = self._v[..., : self._len, :]


    def add_row(self, other: GrowingLayer) -> None:
        """Append ``other``'s single sequence as a new batch row; the shorter side is zero-padded (padding is
        masked out by the caller, and zeros keep masked scores finite)."""
        k, v, n = other._k[..., : other._len, :], other._v[..., : other._len, :], other._len
        if self._k is None:
            self._k, self._v, self._len = k.clone(), v.clone(), n
        else:
            length = max(self._len, n)
            cap = max(self._k.shape[-2], length + 64)
            rows = self._k.shape[0]
            nk = self._k.new_zeros(rows + 1, *self._k.shape[1:-2], cap, self._k.shape[-1])
            nv = self._v.new_zeros(rows + 1, *self._v.shape[1:-2], cap, self._v.shape[-1])
            nk[:rows, ..., : self._len, :] = self._k[..., : self._len, :]
            nv[:rows, ..., : self._len, :] = self._v[..., : self._len, :]
            nk[rows, ..., :n, :] = k[0]
            nv[rows, ..., :n, :] = v[0]
            self._k, self._v, self._len = nk, nv, length
        if not self.is_initialized:
            self.lazy_initialization(k, v)
        self.keys = self._k[..., : self._len, :]
        self.values = self._v[..., : self._len, :]

    def move_slots(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slot ``src[i]`` of row ``rows[i]`` to slot ``dst[i]`` (all gathered before any is written)."""
        self._k[rows, :, dst] = self._k[rows, :, src]
        self._v[rows, :, dst] = self._v[rows, :, src]


class GrowingCache(DynamicCache):
    """A DynamicCache whose layers append in place (full attention layers only)."""

    def __init__(self):
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    def select_rows(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            layer.select_rows(rows)

    def set_row_offsets(self, offsets: torch.Tensor | None, end: int = 0) -> None:
        """Where each row's states of the next forward go (None: appended after the longest row), and ``end``,
        the slot after the last of them."""
        for layer in self.layers:
            layer.row_offsets, layer.row_end = offsets, end

    def add_row(self, other: GrowingCache) -> None:
        """Append the single sequence cached in ``other`` as a new batch row (see :meth:`GrowingLayer.add_row`)."""
        while len(self.layers) < len(other.layers):
            self.layers.append(GrowingLayer())
        for mine, theirs in zip(self.layers, other.layers):
            mine.add_row(theirs)
