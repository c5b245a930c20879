"""Copies of weights (widened to float32, packed for oneDNN) kept while their weight lives and is unchanged, within a
byte budget: one piece of bookkeeping for both (gemm.widened_weight, onednn.linear).

A copy is keyed by the weight's ``id`` and checked against the weight itself (a weak reference), its version counter
and its storage: an in-place change through the tensor or new storage (``w.data = ...``) makes it stale, and it goes
with its weight. Writes the version counter does not see (through ``.data``) need :meth:`KeptCopies.clear`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import torch


class KeptCopies:
    """Per-weight copies up to ``limit()`` bytes in all (read at each new copy, so an environment change applies)."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self.limit = limit
        self.entries: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}
        self.nbytes = 0
        # re-entrant: a weight freed by the garbage collector while this thread holds the lock runs _forget, which
        # takes it too
        self._lock = threading.RLock()

    def get(self, w: torch.Tensor) -> torch.Tensor | None:
        """``w``'s kept copy if it is still current, else None."""
        hit = self.entries.get(id(w))
        if hit is None or hit[0]() is not w:
            return None
        try:
            current = hit[1] == w._version and hit[2] == w.data_ptr()
        except RuntimeError:  # an inference tensor has no version counter
            return None
        return hit[3] if current else None

    def put(self, w: torch.Tensor, nbytes: int, make: Callable[[], torch.Tensor]) -> torch.Tensor | None:
        """``make()``'s copy of ``w``, kept, where ``nbytes`` more fit the budget; None (nothing made) where they do
        not, or where ``w`` has no version counter (an inference tensor: nothing would tell when it changes)."""
        try:
            version = w._version
        except RuntimeError:
            return None
        key = id(w)
        with self._lock:
            old = self.entries.get(key)  # a stale copy, or one another thread stored meanwhile
            if old is not None:
                self._forget(key, old[0])
            if self.nbytes + nbytes > self.limit():
                return None
            copy = make()
            ref = weakref.ref(w, lambda r, k=key: self._forget(k, r))
            self.entries[key] = (ref, version, w.data_ptr(), copy)
            self.nbytes += copy.numel() * copy.element_size()
        return copy

    def clear(self) -> None:
        """Drop every copy."""
        with self._lock:
            self.entries.clear()
            self.nbytes = 0

    def _forget(self, key: int, ref: weakref.ref) -> None:
        """Drop ``key``'s copy if it is still the one ``ref`` belongs to (a weakref callback, or a stale entry)."""
        with self._lock:
            entry = self.entries.get(key)
            if entry is not None and entry[0] is ref:
                del self.entries[key]
                self.nbytes -= entry[3].numel() * entry[3].element_size()
