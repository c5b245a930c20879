"""The corpus source: retrieval from a fixed corpus of the target's answers (sources/corpus.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from drafttree.accept import Sampling
from drafttree.errors import DraftTreeError
from drafttree.sources.base import RoundContext
from drafttree.sources.corpus import CorpusIndex, CorpusSource, corpus_cell, load_corpus, write_corpus

DOCS = [[5, 6, 7, 8, 9], [5, 6, 7, 8, 4], [1, 6, 7, 3], [2, 5, 6, 7, 8, 9, 10]]


def _tokens(docs=DOCS) -> np.ndarray:
    return np.concatenate([np.array(d + [-1]) for d in docs])


def test_index_finds_the_longest_suffix_and_its_latest_occurrences():
    ix = CorpusIndex(_tokens(), max_ngram=4)
    toks = ix.tokens.tolist()
    n, starts = ix.lookup([0, 5, 6, 7])
    assert n == 3 and [toks[s] for s in starts] == [8, 8, 8]  # [5, 6, 7] three times, each followed by 8
    assert list(starts) == sorted(starts)
    n, starts = ix.lookup([0, 5, 6, 7], max_occurrences=2)
    assert n == 3 and list(starts) == list(ix.lookup([0, 5, 6, 7])[1][-2:])  # the latest two
    n, starts = ix.lookup([1, 6, 7])
    assert n == 3 and [toks[s] for s in starts] == [3]
    assert ix.lookup([9, 5])[0] == 0  # 9 is followed by a separator (or 10), never by 5: no n-gram across answers
    assert ix.lookup([8, 9, 10])[0] == 3
    assert ix.lookup([123456, 7])[0] == 0  # ids the corpus never uses match nothing
    assert ix.lookup([7])[0] == 0  # one token is too weak a match to propose from


def test_index_packs_what_fits_in_64_bits():
    big = CorpusIndex(np.array([150_000, 3, 4, 5, -1]), max_ngram=4)
    assert big.bits == 18 and big.max_ngram == 3
    assert big.lookup([150_000, 3, 4])[0] == 3


def _rc(context, depth=8, bar=0.0):
    return RoundContext(context, context[-1], depth, Sampling(), [], bar)


def test_source_proposes_a_trie_of_the_most_common_continuations():
    src = CorpusSource(CorpusIndex(_tokens()), num_tokens=3)
    prop = src.propose(_rc([0, 5, 6, 7]), 1)
    c = prop.cands
    # continuations of [5, 6, 7]: [8, 9] (the answer ends), [8, 4], [8, 9, 10] -> 8 shared by all three
    toks, pars = c.tokens.tolist(), c.parents.tolist()
    edges = {(toks[p] if p >= 0 else None, t) for t, p in zip(toks, pars)}
    assert len(toks) == 4 and edges == {(None, 8), (8, 9), (8, 4), (9, 10)}
    first = toks.index(8)
    assert c.parents[first] == -1
    assert prop.cells[first] == corpus_cell(3, 1.0, 3, 1)
    assert all(c.score[i] <= c.score[int(c.parents[i])] for i in range(len(c.tokens)) if c.parents[i] >= 0)
    assert src.propose(_rc([0, 5, 6, 7], depth=0), 1) is None
    assert src.propose(_rc([99, 98]), 1) is None
    assert src.propose(_rc([0, 5, 6, 7], bar=0.999), 1) is None  # the batch's bar: no first token clears it
    short = src.propose(_rc([0, 5, 6, 7], depth=1), 1)
    assert short.cands.tokens.tolist() == [8]


def test_corpus_files_round_trip_and_bad_files_are_one_line_errors(tmp_path):
    distilled = tmp_path / "d.jsonl"
    distilled.write_text("\n".join(json.dumps({"id": str(i), "turn": 0, "prompt_ids": [1], "response_ids": d})
                                   for i, d in enumerate(DOCS)))
    info = write_corpus(distilled, tmp_path / "c.npz")
    assert info["answers"] == 4 and info["tokens"] == sum(map(len, DOCS))
    ix = load_corpus(str(tmp_path / "c.npz"))
    assert ix.tokens.size == _tokens().size and ix.lookup([0, 5, 6, 7])[0] == 3
    with pytest.raises(DraftTreeError, match="not found"):
        write_corpus(tmp_path / "none.jsonl", tmp_path / "c2.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a numpy file")
    for path in (tmp_path / "missing.npz", tmp_path / "bad.npz"):
        with pytest.raises(DraftTreeError) as e:
            load_corpus(str(path))
        assert "\n" not in str(e.value)
    np.save(tmp_path / "floats.npy", np.zeros(3))
    with pytest.raises(DraftTreeError, match="integer"):
        load_corpus(str(tmp_path / "floats.npy"))


def test_shipped_corpus_is_found_next_to_the_head(default_fp32, tmp_path):
    from drafttree.drafters import make_drafter
    from drafttree.heads import load_head_for

    head = load_head_for(default_fp32)
    drafter = make_drafter("hybrid", default_fp32, None, head, sources="ngram+corpus+head")
    assert [s.name for s in drafter.sources] == ["ngram", "corpus", "head"]
    assert drafter.sources[1].index.tokens.size > 100_000
    assert [s.name for s in make_drafter("hybrid", default_fp32, None, head).sources] == ["ngram", "corpus", "head"]
    assert [s.name for s in make_drafter("hybrid", default_fp32, None, head, sources="ngram+head").sources] == [
        "ngram", "head"]
    np.save(tmp_path / "mine.npy", _tokens())
    own = make_drafter("hybrid", default_fp32, None, head, sources="ngram+corpus", corpus=str(tmp_path / "mine.npy"))
    assert [s.name for s in own.sources] == ["ngram", "corpus"] and own.sources[1].index.tokens.size == _tokens().size
    np.save(tmp_path / "alien.npy", np.array([5, 6, 7, default_fp32.vocab_size + 10]))
    with pytest.raises(DraftTreeError, match="another tokenizer"):
        make_drafter("hybrid", default_fp32, None, head, sources="ngram+corpus", corpus=str(tmp_path / "alien.npy"))
    with pytest.raises(DraftTreeError, match="corpus not found"):
        make_drafter("hybrid", default_fp32, None, head, sources="ngram+corpus", corpus=str(tmp_path / "none.npz"))
