"""A datastore of the target's own answers as a candidate source (retrieval drafting, as in REST).

Context n-grams only help where the answer copies its context. A fixed corpus of what the target wrote for many
other prompts (its greedy answers to the head's training prompts, never the benchmark's) proposes the phrases it
keeps using: the context's last n tokens (n = ``max_ngram`` down to 2) are looked up in an index of the corpus's
n-grams, and the most common continuations of their latest occurrences are merged into a trie. A node's estimate
comes from its calibration cell (n, the share of occurrences agreeing on it, their number, depth), learned online
against what the target accepted, like every source's. Free to run: a few binary searches, no model call.

The index packs an n-gram into one uint64 (``bits`` per token id, room left for a separator id, so n is at most
64 // bits: 4 for vocabularies up to 65,535 ids, 3 up to 2M) and keeps, per n, the sorted keys and where each
occurs; built once per corpus file and process (~16 bytes per token per n).
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from drafttree.errors import DraftTreeError
from drafttree.sources.base import (
    Calibration,
    NoiseCalibration,
    Proposal,
    RoundContext,
    Trie,
    noise_cells,
    trie_proposal,
)

CORPUS_FILE = "corpus.npz"  # next to a head: ``tokens``, the target's answers (int32), -1 between them
SHARE_EDGES = (0.25, 0.5, 0.75)  # share of the occurrences that agree on a node
COUNT_EDGES = (2, 5)  # how many occurrences agree (1, 2-4, 5+)
DEPTHS = 4  # depth buckets 1, 2, 3, 4+


def _bucket(x: float, edges: tuple) -> int:
    """How many of the (ascending) ``edges`` ``x`` reaches."""
    return bisect.bisect_right(edges, x)


class CorpusIndex:
    """n-gram -> positions that followed it in a fixed token array (documents separated by a negative id)."""

    def __init__(self, tokens: np.ndarray, max_ngram: int = 4):
        tokens = np.asarray(tokens, dtype=np.int64)
        self.vocab = int(tokens.max()) + 1 if tokens.size else 1
        self.bits = max(1, self.vocab.bit_length())  # room for one id more than the corpus uses: the separator
        self.max_ngram = max(2, min(int(max_ngram), 64 // self.bits))
        self.sep = (1 << self.bits) - 1
        ids = np.where(tokens < 0, self.sep, tokens)
        self.tokens = ids
        self.keys: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        packed = ids.astype(np.uint64)
        for n in range(2, self.max_ngram + 1):
            if ids.size < n:
                continue
            k = np.zeros(ids.size - n + 1, dtype=np.uint64)
            ok = np.ones(k.size, dtype=bool)
            for j in range(n):
                k = (k << np.uint64(self.bits)) | packed[j:ids.size - n + 1 + j]
                ok &= ids[j:ids.size - n + 1 + j] != self.sep  # no n-gram that spans a separator
            where = np.nonzero(ok)[0]
            order = np.argsort(k[where], kind="stable")
            self.keys[n] = (k[where][order], where[order] + n)
        self._tries: dict[tuple, tuple | None] = {}  # (suffix, k, occurrences, candidates) -> continuations() result

    def lookup(self, suffix: list[int], max_occurrences: int = 64) -> tuple[int, np.ndarray]:
        """(n, start positions of what followed the latest ``max_occurrences`` occurrences of the suffix's last n
        tokens), the longest n that occurs; (0, []) when none does."""
        for n in range(min(self.max_ngram, len(suffix)), 1, -1):
            if n not in self.keys:
                continue
            last = suffix[-n:]
            if not all(0 <= t < self.vocab for t in last):
                continue
            q = 0
            for t in last:
                q = (q << self.bits) | int(t)
            keys, starts = self.keys[n]
            q = np.uint64(q)
            a, b = int(np.searchsorted(keys, q, "left")), int(np.searchsorted(keys, q, "right"))
            if b > a:
                return n, starts[max(a, b - max_occurrences):b]
        return 0, np.zeros(0, dtype=np.int64)


    def continuations(self, suffix: tuple[int, ...], k: int, max_occurrences: int, max_candidates: int):
        """The trie of the most common ``k``-token continuations of the suffix's latest occurrences, with each node's
        calibration cell: (tokens, parents, cells), or None. Memoised (it depends on the last ``max_ngram`` tokens
        only, which many rows and rounds share: in a batch of 16, drafting took ~15% of a round)."""
        key = (suffix[-self.max_ngram:], k, max_occurrences, max_candidates)
        if key in self._tries:
            return self._tries[key]
        if len(self._tries) >= 1 << 16:
            self._tries.clear()
        n, starts = self.lookup(list(key[0]), max_occurrences)
        out = None
        if n:
            conts = Counter()
            for s in starts.tolist():
                seq = self.tokens[s:s + k].tolist()
                if self.sep in seq:
                    seq = seq[:seq.index(self.sep)]
                if seq:
                    conts[tuple(seq)] += 1
            total = sum(conts.values())
            if total:
                trie = Trie()
                for seq, c in conts.most_common(max_candidates):
                    trie.add(seq, c)
                cells = [corpus_cell(n, c / total, c, d) for c, d in zip(trie.weights, trie.depths)]
                out = (trie.tokens, trie.parents, cells)
        self._tries[key] = out
        return out


def cells_shape() -> tuple[int, int, int, int]:
    return _SHAPE


_SHAPE = (5, len(SHARE_EDGES) + 1, len(COUNT_EDGES) + 1, DEPTHS)  # n in 0..4 (0, 1 unused)


def corpus_cell(n: int, share: float, count: int, depth: int) -> int:
    _, s, c, d = _SHAPE
    return ((min(n, 4) * s + _bucket(share, SHARE_EDGES)) * c + _bucket(count, COUNT_EDGES)) * d + min(depth, d) - 1


def corpus_prior() -> torch.Tensor:
    """Before any observation (and where no fitted prior ships): agreement matters most, then the number of
    occurrences and n (the shape of what greedy verification accepted on held-out answers, docs/training.md)."""
    n_, s_, c_, d_ = cells_shape()
    share, count, ngram = (0.06, 0.15, 0.25, 0.5), (0.7, 1.0, 1.4), (1.0, 1.0, 0.9, 1.0, 1.2)
    out = torch.zeros(n_, s_, c_, d_)
    for n in range(n_):
        for s in range(s_):
            for c in range(c_):
                out[n, s, c, :] = min(0.8, share[s] * count[c] * ngram[n])
    return out.reshape(-1)


@functools.lru_cache(maxsize=4)
def load_corpus(path: str, max_ngram: int = 4) -> CorpusIndex:
    """The index of a corpus file (``.npz`` with ``tokens``, or a ``.npy``: token ids, -1 between documents), built
    once per process."""
    p = Path(path)
    if not p.exists():
        raise DraftTreeError(f"corpus not found: {p}")
    try:
        with open(p, "rb") as fh:
            data = np.load(fh, allow_pickle=False)
            if isinstance(data, np.lib.npyio.NpzFile):
                with data:
                    tokens = data["tokens"]
            else:
                tokens = data
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same one-line error
        why = " ".join(str(e).split())[:200]
        raise DraftTreeError(f"{p} is not a corpus (.npz with 'tokens', or .npy of token ids): {why}") from None
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise DraftTreeError(f"{p} must hold a 1-D integer array of token ids, not {tokens.dtype} {tokens.shape}")
    return CorpusIndex(tokens, max_ngram)


class CorpusSource:
    """Retrieval from a fixed corpus of the target's answers (see the module doc)."""

    name = "corpus"
    cost = 0.0

    def __init__(self, index: CorpusIndex, num_tokens: int = 8, max_candidates: int = 8,
                 max_occurrences: int = 64):
        self.index = index
        self.num_tokens, self.max_candidates, self.max_occurrences = num_tokens, max_candidates, max_occurrences
        self.calibration = Calibration(corpus_prior())

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        pass

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        pass

    def propose(self, rc: RoundContext, index: int) -> Proposal | None:
        k = min(self.num_tokens, rc.max_depth)
        if k <= 0:
            return None
        found = self.index.continuations(tuple(rc.context[-self.index.max_ngram:]), k, self.max_occurrences,
                                         self.max_candidates)
        if found is None:
            return None
        tokens, parents, cells = found
        if isinstance(self.calibration, NoiseCalibration):  # T > 0: each cell split by its candidate's noise bin
            depths: list[int] = []
            for p in parents:  # parents before children
                depths.append(1 if p < 0 else depths[p] + 1)
            cells = noise_cells(self.calibration, cells, tokens, depths, rc)
        rate = self.calibration.rate_of
        if rc.min_accept > 0 and max(rate(c) for c, p in zip(cells, parents) if p < 0) < rc.min_accept:
            return None  # a batch's bar: no first token is good enough
        return trie_proposal(index, tokens, parents, torch.tensor(cells, dtype=torch.long), self.calibration)

    def sampled_calibration(self) -> NoiseCalibration:
        """This source's calibration at T > 0: its cells split by noise bin (sources/base.py, NOISE_EDGES)."""
        return NoiseCalibration(corpus_prior())


def write_corpus(distilled: str | Path, out: str | Path) -> dict:
    """The target's answers in a distilled JSONL (``drafttree data distill``) as a corpus file: a compressed
    ``.npz`` holding ``tokens`` (int32, -1 between answers)."""
    from drafttree.train.data import iter_distilled

    if not Path(distilled).is_file():
        raise DraftTreeError(f"distilled answers not found: {distilled}")
    parts, answers = [], 0
    for rec in iter_distilled(distilled):
        ids = rec.get("response_ids") or []
        if ids:
            parts.append(np.asarray(ids, dtype=np.int32))
            parts.append(np.array([-1], dtype=np.int32))
            answers += 1
    if not parts:
        raise DraftTreeError(f"no answers in {distilled}")
    tokens = np.concatenate(parts)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, tokens=tokens)
    return {"answers": answers, "tokens": int(tokens.size - answers), "file": str(out),
            "bytes": out.stat().st_size}


def fit_greedy_prior(distilled: str | Path, holdout_every: int = 10, stride: int = 2, limit: int | None = None,
                     progress=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Hits and trials per cell at T = 0, measured on answers held out of the corpus (every ``holdout_every``-th
    answer, by id): at every ``stride``-th position of a held-out answer the source proposes from an index of the
    others, and every proposed node whose parent the answer follows is a trial, a hit when the answer's next token
    is the node's. The answers are the target's greedy outputs, so this is what greedy verification accepts."""
    import zlib

    from drafttree.train.data import iter_distilled

    keep, held = [], []
    for rec in iter_distilled(distilled):
        ids = rec.get("response_ids") or []
        if ids:
            (held if zlib.crc32(str(rec.get("id")).encode()) % holdout_every == 0 else keep).append(
                (list(rec.get("prompt_ids") or []), list(ids)))
    if not keep or not held:
        raise DraftTreeError(f"{distilled}: too few answers (with distinct ids) to hold some out of the corpus")
    tokens = np.concatenate([np.array(ids + [-1], dtype=np.int64) for _, ids in keep])
    src = CorpusSource(CorpusIndex(tokens))
    hits, trials = torch.zeros_like(src.calibration.prior), torch.zeros_like(src.calibration.prior)
    for prompt, answer in held[:limit]:
        for t in range(1, len(answer), stride):
            prop = src.propose(RoundContext(prompt + answer[:t], answer[t - 1], 8, None, []), 0)
            if prop is None:
                continue
            toks, pars, cells = prop.cands.tokens.tolist(), prop.cands.parents.tolist(), prop.cells.tolist()
            on_path = {-1: 0}  # node -> depth of the answer it stands for, for nodes the answer follows
            for i, (tok, p) in enumerate(zip(toks, pars)):
                if p in on_path:
                    depth = on_path[p]
                    trials[cells[i]] += 1
                    if t + depth < len(answer) and answer[t + depth] == tok:
                        hits[cells[i]] += 1
                        on_path[i] = depth + 1
        if progress is not None:
            progress()
    return hits, trials
