"""Newcomers' prefill beside a decoding batch (batching/admission.py), on the real default model in float32: a long
prompt joins a chunk a round while the running rows keep decoding, short ones wait for the round's budget, and
every row's greedy output equals the prompt decoded alone."""

from __future__ import annotations

import pytest

from drafttree.errors import DraftTreeError

STORY = ("The lighthouse stood at the end of a long stone pier, and every evening the keeper climbed its hundred "
         "steps to light the lamp. ")
LONG = "Read this and then say in one sentence what the keeper did each evening: " + STORY * 9
SHORT = ["Write a haiku about autumn leaves.", "List three colours.", "Name a large city in Asia.",
         "What is two plus two?", "Say hello in French."]
NEW = 24


@pytest.fixture(scope="module")
def lm(default_fp32):
    from drafttree import SpeculativeModel

    return SpeculativeModel(default_fp32, method="lookup")


@pytest.fixture(scope="module")
def alone(lm):
    return {p: lm.generate(p, max_new_tokens=NEW).tokens for p in [LONG] + SHORT}


def _seq(lm, prompt):
    from drafttree.accept import Sampling
    from drafttree.batching import Sequence
    from drafttree.drafters import make_drafter

    return Sequence(lm.encode_prompt(prompt), make_drafter("lookup", lm.target, None, None), Sampling(), NEW,
                    frozenset(lm.eos_ids), tag=prompt)


def _decoder(lm, chunk):
    from drafttree.batching import BatchDecoder

    lm.batch_target().keep([])
    return BatchDecoder(lm.batch_target(), lm.verify_cost(), lm.batch_policy, prefill_chunk=chunk)


def test_a_long_prompt_joins_a_chunk_a_round_while_the_rows_decode(lm, alone, monkeypatch):
    from drafttree.batching.admission import MIN_CHUNK, PromptInChunks, keys_per_token, prompt_cost

    reused = []
    real = PromptInChunks.advance

    def advance(self, tokens):
        before = self.done
        real(self, tokens)
        reused.append((before, self.single.reused))

    monkeypatch.setattr(PromptInChunks, "advance", advance)
    chunk = 48
    dec = _decoder(lm, chunk)
    running, late = _seq(lm, SHORT[0]), _seq(lm, LONG)
    assert dec.add(running) is not None  # nothing decodes yet: prefilled at once
    dec.step()
    assert dec.add(late) is None and dec.rows == 2  # held back, its place kept
    n = late.prompt_ids.numel()
    assert n > 3 * chunk
    rounds = 0
    while not late.tokens:
        got = {id(s): new for s, new in dec.step()}
        rounds += 1
        if not running.finished:
            assert got.get(id(running)), "the running row decodes in every round of the newcomer's prefill"
    # its first chunk ran in add(), whose round it was (that round's budget spent), then one a round
    assert rounds == len(reused) and reused[0] == (0, 0)
    assert all(r == b for b, r in reused)  # each chunk computed only its own tokens
    ends = [b for b, _ in reused[1:]] + [n]
    k = keys_per_token(lm.target.model)
    for (b, _), e in zip(reused, ends):  # a later chunk is shorter: its tokens read more keys
        assert prompt_cost(e - b, b, k) <= chunk + 1 or e - b == MIN_CHUNK or e == n
    assert ends[1] - reused[1][0] < chunk  # the second chunk already reads the first one's keys
    while dec.rows:
        dec.step()
    assert late.tokens == alone[LONG] and running.tokens == alone[SHORT[0]]


def test_short_newcomers_wait_for_the_rounds_budget_in_order(lm, alone):
    dec = _decoder(lm, 40)
    first = _seq(lm, SHORT[0])
    dec.add(first)
    dec.step()
    rest = [_seq(lm, p) for p in SHORT[1:]]
    sizes = [s.prompt_ids.numel() for s in rest]
    assert all(n <= 40 for n in sizes) and sum(sizes[:2]) > 40
    firsts = dec.add_many(rest)
    assert firsts[0] is not None and all(f is None for f in firsts[1:])  # one fits this round, the rest wait
    joined_at = {}
    step = 0
    while dec.rows:
        step += 1
        for s, new in dec.step():
            if new and id(s) not in joined_at:
                joined_at[id(s)] = step
    order = [joined_at[id(s)] for s in rest[1:]]
    assert order == sorted(order) and order[-1] > order[0]  # in the order they came, over several rounds
    for s in [first] + rest:
        assert s.tokens == alone[s.tag]


def test_a_cancelled_newcomer_is_never_prefilled(lm):
    dec = _decoder(lm, 32)
    dec.add(_seq(lm, SHORT[0]))
    late = _seq(lm, LONG)
    assert dec.add(late) is None
    late.cancelled = True
    out = dec.step()
    assert (late, []) in [(s, n) for s, n in out]
    assert late.stats.finish_reason == "cancelled" and dec.rows == 1 and dec.target.rows == 1


def test_nothing_is_held_back_without_running_rows_off_or_batch_invariant(lm):
    idle = _decoder(lm, 16)
    assert idle.add(_seq(lm, LONG)) is not None  # no row decodes: nobody waits for the prefill
    for chunk, invariant in ((0, False), (16, True)):
        dec = _decoder(lm, chunk)
        dec.target.batch_invariant = invariant
        try:
            dec.add(_seq(lm, SHORT[0]))
            assert dec.add(_seq(lm, LONG)) is not None
        finally:
            dec.target.batch_invariant = False


@pytest.mark.parametrize("bad", [-1, 1.5, "64", True])
def test_a_bad_prefill_chunk_is_a_clear_error(lm, bad):
    with pytest.raises(DraftTreeError, match="prefill_chunk"):
        lm.prefill_chunk = bad
    with pytest.raises(DraftTreeError, match="prefill_chunk"):
        _decoder(lm, bad)


def test_stream_batch_with_chunked_newcomers_is_exact(lm, alone):
    """A batch of one row at a time (max_batch=2) whose later prompts join while a row decodes: the API streams
    every prompt's text, equal to each alone."""
    lm.prefill_chunk = 32
    try:
        prompts = [SHORT[0], LONG, SHORT[1]]
        texts = {i: [] for i in range(len(prompts))}
        for i, chunk in lm.stream_batch(prompts, max_new_tokens=NEW, max_batch=2):
            texts[i].append(chunk)
        results = lm.batch_results()
    finally:
        lm.prefill_chunk = 512
    for p, r in zip(prompts, results):
        assert r.tokens == alone[p]
    assert all(texts[i] for i in texts)


def test_a_next_turn_from_the_prefix_pool_prefills_only_its_rest_in_chunks(default_fp32, monkeypatch):
    """With the prefix cache, a chat's next turn joining a decoding batch starts from its pool entry and prefills
    only the rest, a chunk a round; its answer is plain decoding's."""
    from drafttree import SpeculativeModel
    from drafttree.batching.admission import PromptInChunks

    plain = SpeculativeModel(default_fp32, method="lookup")
    cached = SpeculativeModel(default_fp32, method="lookup", prefix_cache=True)
    conv = [{"role": "user", "content": LONG}]
    first = cached.generate([conv], max_new_tokens=NEW)[0]  # its row leaves its states in the pool
    conv += [{"role": "assistant", "content": first.text},
             {"role": "user", "content": "Now tell it again, but for a child, with the lamp and the steps in it."}]
    taken = []
    real = PromptInChunks.advance
    monkeypatch.setattr(PromptInChunks, "advance", lambda self, n: (taken.append(min(n, self.left)), real(self, n)))
    dec = _decoder(cached, 16)
    dec.add(_seq(cached, SHORT[0]))
    dec.step()
    nxt = _seq(cached, conv)
    assert dec.add(nxt) is None
    while dec.rows:
        dec.step()
    n, reused = nxt.prompt_ids.numel(), nxt.stats.cached_tokens
    assert reused > 100 and sum(taken) == n - reused and len(taken) >= 2  # the rest only, in chunks
    assert nxt.tokens == plain.generate(conv, max_new_tokens=NEW).tokens


def test_a_held_back_newcomer_joining_in_a_later_add_is_handed_out_by_the_next_step(lm, alone):
    """The rows end while a long prompt waits; the next add_many (nothing decodes: all at once) admits it before the
    newcomer it was called for: its first token comes out of the next step, none is lost."""
    dec = _decoder(lm, 32)
    short = _seq(lm, SHORT[0])
    short.max_new_tokens = 2
    dec.add(short)
    late = _seq(lm, LONG)
    assert dec.add(late) is None
    while not short.finished:
        dec.step()
    assert not dec.active and dec.held_back == [late]
    other = _seq(lm, SHORT[1])
    got = {id(other): dec.add(other)}
    assert got[id(other)] is not None and late.tokens  # both joined in that add
    firsts = [new for s, new in dec.step() if s is late]
    assert firsts[0] == late.tokens[:1]  # its first token, then the round's
    while dec.rows:
        dec.step()
    assert late.tokens == alone[LONG] and other.tokens == alone[SHORT[1]]


def test_short_newcomers_pass_a_long_prompt_that_is_prefilled_in_chunks(lm, alone):
    """Short prompts that arrive behind a long one being prefilled a chunk a round join in the next round (half its
    budget), not after the long one's last chunk; the long one still gets a chunk every round; all exact."""
    dec = _decoder(lm, 160)
    dec.add(_seq(lm, SHORT[0]))
    late = _seq(lm, LONG)
    assert dec.add(late) is None
    shorts = [_seq(lm, p) for p in SHORT[1:3]]
    assert sum(s.prompt_ids.numel() for s in shorts) <= 80
    assert dec.add_many(shorts) == [None, None]  # this round's budget went to the long one's first chunk
    dec.step()
    assert not any(s.tokens for s in shorts)
    dec.step()  # the next round's budget: the short ones first (half of it), then the long one's next chunk
    assert all(s.tokens for s in shorts) and not late.tokens  # they passed it
    while dec.rows:
        dec.step()
    for s in shorts + [late]:
        assert s.tokens == alone[s.tag]
