"""Batch policies: DraftOrPlain (per batch size, the better of drafting and plain rounds, with probes of the other) and
DraftWhilePays (rounds draft while their accepted drafts pay for the drafting and the drafted tokens' verification)."""

import pytest

from drafttree.batching.policy import DraftOrPlain, DraftWhilePays, bucket
from drafttree.drafters.base import Drafter
from drafttree.tree import DraftTree


def run(policy: DraftOrPlain, rows: int, rates: dict[bool, float], rounds: int) -> list[bool]:
    choices = []
    for _ in range(rounds):
        d = policy.choose(rows)
        choices.append(d)
        policy.record(rows, d, int(rates[d] * 10), 10.0)
    return choices


def test_buckets():
    assert [bucket(n) for n in (1, 2, 3, 4, 7, 8, 16, 63, 64)] == [1, 2, 2, 4, 4, 8, 16, 32, 64]


def test_picks_the_faster_mode_and_probes_the_other_less_and_less():
    p = DraftOrPlain(probe=4, max_probe=64, growth=2)
    choices = run(p, 16, {True: 2.0, False: 5.0}, 200)
    # the first round is not measured (nothing to compare a switch with), then 4 measured plain rounds
    assert choices[:8] == [False] * 5 + [True] * 3, "a batch starts plain and probes drafting (3 rounds) after the wait"
    starts = [i for i in range(1, len(choices)) if choices[i] and not choices[i - 1]]
    assert sum(choices[: starts[-1]]) == 3 * (len(starts) - 1) and sum(choices) < 25, \
        "plain rounds pay more here: drafting only as probes of 3 rounds"
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > 2 * gaps[0], "failed probes wait longer and longer"
    assert sum(run(DraftOrPlain(), 16, {True: 5.0, False: 2.0}, 100)) > 80  # drafting pays: mostly drafting
    alone = run(DraftOrPlain(), 1, {True: 5.0, False: 2.0}, 10)
    assert alone[0] is True, "a lone sequence starts drafting (its drafter's budget already sizes the tree)"


def test_batch_sizes_are_measured_separately():
    p = DraftOrPlain(probe=4)
    run(p, 2, {True: 5.0, False: 2.0}, 50)
    run(p, 16, {True: 2.0, False: 5.0}, 50)
    assert p.rate[(2, True)] > p.rate[(2, False)] and p.rate[(16, False)] > p.rate[(16, True)]


def test_a_lone_sequence_leaves_the_choice_to_its_drafter():
    """One row: no timing of single rounds; its drafter's budget decides each tree (root only when none pays)."""
    assert all(run(DraftOrPlain(probe=2), 1, {True: 1.0, False: 9.0}, 40))


def test_a_new_batch_size_starts_from_the_nearest_measured_one():
    p = DraftOrPlain(probe=4)
    run(p, 16, {True: 2.0, False: 5.0}, 30)
    first = run(p, 8, {True: 2.0, False: 5.0}, 4)
    assert first == [False] * 4, "8 rows start plain, as 16 rows measured, and probe only after the wait"


def test_the_round_after_a_switch_is_not_what_the_mode_costs():
    """Drafting after plain rounds first pays for the drafters' catch-up (e.g. a head encoding the backlog): that
    round is slow, the next ones are fast. The policy must judge drafting by the rounds after the switch."""
    p, choices, last = DraftOrPlain(probe=4), [], False
    for _ in range(120):
        d = p.choose(16)
        rate = 2.0 if not d else (0.1 if not last else 5.0)
        p.record(16, d, int(rate * 10), 10.0)
        choices.append(d)
        last = d
    assert p.rate[(16, True)] > p.rate[(16, False)]
    assert sum(choices[-60:]) > 50, "drafting pays once caught up: mostly drafting"


def drive(policy: DraftWhilePays, rows: int, gains, rounds: int, cost: float = 2.0, rest: float = 30.0,
          kind: str = "hybrid", tail: bool = False, tail_gains=lambda i: 0, row_seconds: float = 0.0) -> list[bool]:
    """``rounds`` rounds of ``rows`` rows; a drafting round accepts ``gains(i)`` drafts over the roots for ``cost``
    seconds of drafting and verification on top of ``rest`` (plain rounds accept the roots only), of which
    ``tail_gains(i)`` are the row with the most tokens left's; ``tail``: nobody waits for a row; ``row_seconds``: what
    a row adds to a round."""
    choices = []
    for i in range(rounds):
        d = policy.choose(rows, kind, tail=tail)
        choices.append(d)
        g = gains(i) if d else 0
        policy.record(rows, d, rows + g, rest + (cost if d else 0.0), drafting=cost / 2 if d else 0.0,
                      extra_verify=cost / 2 if d else 0.0, kind=kind, tail_drafts=tail_gains(i) if d else 0,
                      row_seconds=row_seconds)
    return choices


def test_draft_while_pays_drafts_where_the_drafts_pay_for_their_whole_cost():
    # 16 rows, 2 s of drafting and verification on 30 s: drafting pays above 16 x 2 / 30 = 1.07 accepted drafts a round
    assert all(drive(DraftWhilePays(), 16, lambda i: 2, 300)), "2 drafts a round pay: every round drafts"
    weak = drive(DraftWhilePays(), 16, lambda i: 0, 600)
    assert all(weak[:8]), "a new batch size starts drafting (a prior that pays), measuring"
    assert sum(weak[-300:]) < 30, "drafts that pay nothing: plain rounds but for short probes"
    starts = [i for i in range(1, len(weak)) if weak[i] and not weak[i - 1]]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(gaps) >= 2 and gaps == sorted(gaps) and gaps[-1] > gaps[0], "failed probes wait longer and longer"
    # a broken rule that compared the gain with the drafting alone (not its verification) drafts here: 1 < 1.07
    assert sum(drive(DraftWhilePays(), 16, lambda i: 1, 600)[-300:]) < 60
    assert sum(drive(DraftWhilePays(), 4, lambda i: 1, 600)[-300:]) > 270, "4 rows: 1 draft beats 4 x 2 / 30"


def test_draft_while_pays_judges_bursts_by_their_mean():
    """Accepted drafts come in bursts (a copied passage, then nothing): 8 drafts every 4th round pay on average
    (2 a round against 1.07 needed), so the rounds keep drafting through the dry rounds between bursts."""
    assert sum(drive(DraftWhilePays(), 16, lambda i: 8 if i % 4 == 0 else 0, 400)) > 380


def test_draft_while_pays_starts_a_new_batch_size_from_the_nearest_measured_one():
    """A burst's rows leave and the batch walks down the sizes: a size first seen after another closed starts closed
    (and probes), one first seen after another paid starts drafting; a broken rule that started every size from the
    optimistic prior drafts the first rounds of each."""
    p = DraftWhilePays()
    drive(p, 32, lambda i: 0, 300)
    assert not p.pays((32, "hybrid"))
    smaller = drive(p, 16, lambda i: 0, 40)
    assert not any(smaller[:15]), "closed at 32 rows: 16 rows start plain, then probe"
    assert any(smaller[15:]), "and still probe"
    q = DraftWhilePays()
    drive(q, 32, lambda i: 4, 100)
    assert all(drive(q, 16, lambda i: 4, 40)), "paid at 32 rows: 16 rows draft from the start"
    assert sum(drive(DraftWhilePays(), 16, lambda i: 0, 40)[:15]) >= 8, "nothing measured: the optimistic prior"


def test_draft_while_pays_keeps_each_mix_of_drafters_apart_and_leaves_one_row_to_its_drafter():
    p = DraftWhilePays()
    drive(p, 16, lambda i: 0, 300, kind="ar")
    assert drive(p, 16, lambda i: 3, 20, kind="hybrid") == [True] * 20, "ar rows' rounds do not close auto's"
    assert p.pays((16, "hybrid")) and not p.pays((16, "ar"))
    assert all(drive(DraftWhilePays(), 1, lambda i: 0, 50)), "one row: its drafter's own budget decides"


def test_with_nobody_waiting_drafting_rounds_are_judged_by_the_row_the_batch_waits_for():
    """A burst's 4 rows, 2 s of drafting on 30 s rounds (drafting pays above 4 x 2 / 30 = 0.27 drafts a row): the rows
    accept 4 drafts a round, all of them the rows that will finish first; the row with the most tokens left accepts
    none. With requests waiting, early finishers let them in and every row's drafts count: rounds draft. With nobody
    waiting, the batch lasts as long as that row and drafting only delays it: plain rounds but for probes. A broken
    policy that ignored ``tail`` would draft here; the same row accepting 1 draft a round (worth a round of every
    row) keeps the rounds drafting. The other rows' drafts are worth what their rows add to each round once they end:
    nothing on a flat curve; a row's full share where each row adds its share (an arithmetic-bound forward), and then
    the rounds draft as with requests waiting; at a fifth of a share 4 drafts are worth 0.8 of a row's, above 0.27."""
    assert all(drive(DraftWhilePays(), 4, lambda i: 4, 300)), "requests waiting: the rows' 4 drafts a round pay"
    burst = drive(DraftWhilePays(), 4, lambda i: 4, 600, tail=True)
    assert all(burst[:8]) and sum(burst[-300:]) < 30, "nobody waiting: the last row's 0 drafts close the rounds"
    assert all(drive(DraftWhilePays(), 4, lambda i: 4, 300, tail=True, tail_gains=lambda i: 1))
    assert all(drive(DraftWhilePays(), 4, lambda i: 4, 300, tail=True, row_seconds=30.0 / 4))
    assert all(drive(DraftWhilePays(), 4, lambda i: 4, 300, tail=True, row_seconds=30.0 / 4 / 5))
    assert sum(drive(DraftWhilePays(), 4, lambda i: 4, 600, tail=True, row_seconds=30.0 / 4 / 20)[-300:]) < 30
    p = DraftWhilePays()  # one policy serves both: a burst's closed rounds do not close a loaded server's
    drive(p, 4, lambda i: 4, 300, tail=True)
    assert not p.pays((4, "hybrid|tail")) and all(drive(p, 4, lambda i: 4, 50))


class Oracle(Drafter):
    """Drafts the next ``k`` tokens of a known greedy answer (all accepted at T=0), or ``k`` wrong ones (none)."""

    name = "oracle"

    def __init__(self, answer: list[int], prompt_len: int, k: int, right: bool, vocab: int):
        self.answer, self.prompt_len, self.k, self.right, self.vocab = answer, prompt_len, k, right, vocab

    def propose(self, req):
        done = len(req.context) - self.prompt_len  # answer tokens so far, the root the last of them
        nxt = self.answer[done: done + min(self.k, req.max_depth)]
        return DraftTree.chain(req.root, nxt if self.right else [(t + 1) % self.vocab for t in nxt])


def test_the_batch_decoder_tells_the_policy_who_waits_and_the_last_rows_accepted_drafts():
    """Two rows of a tiny model: one drafts its true greedy answer 3 tokens at a time (3 accepted), the other wrong
    tokens (none). The policy hears ``tail`` when nobody waits for a row (not when ``waiting`` says someone does), and
    after each round the accepted drafts of the row with the most tokens left, the fewest among rows tied for it:
    expected by counting tokens by hand."""
    import torch

    from drafttree.accept import Sampling
    from drafttree.batching import BatchDecoder, BatchTarget, Sequence
    from drafttree.batching.policy import AlwaysDraft
    from drafttree.decode import decode
    from drafttree.target import TargetModel
    from tests.conftest import tiny_causal_lm

    class Heard(AlwaysDraft):
        def __init__(self):
            super().__init__()
            self.tails, self.drafts = [], []

        def choose(self, rows, kind="", tail=False):
            self.tails.append(tail)
            return True

        def record(self, rows, drafted, tokens, seconds, measured=True, drafting=0.0, extra_verify=0.0, kind="",
                   tail_drafts=None, row_seconds=0.0):
            self.drafts.append(tail_drafts)

    lm = tiny_causal_lm("llama", vocab=64, hidden=32, seed=5)
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([9, 10, 11, 12])]
    answers = [[t for step in decode(TargetModel(lm), Drafter(), p, Sampling(), 70) for t in step] for p in prompts]
    for waiting in (0, 1):
        heard = Heard()
        dec = BatchDecoder(BatchTarget(lm), None, heard)
        dec.waiting = waiting
        limits = [60, 30]  # the right row has the longer answer to write: it is the last row until it catches up
        rows = [Sequence(p, Oracle(a, len(p), 3, right, 64), Sampling(), n)
                for p, a, right, n in zip(prompts, answers, (True, False), limits)]
        for r in rows:
            dec.add(r)
        made, expected = [1, 1], []  # each row's tokens so far (the prefill's first); by hand, round by round
        while dec.rows == 2:
            left = [n - m for n, m in zip(limits, made)]
            gains = [min(3, left[0] - 1), 0]  # accepted drafts: the right row's 3 (never past its limit), none
            expected.append(min(g for g, x in zip(gains, left) if x == max(left)))
            made = [m + g + 1 for m, g in zip(made, gains)]
            dec.step()
        assert rows[0].tokens == answers[0][:60] and rows[1].tokens == answers[1][: len(rows[1].tokens)]
        assert heard.tails == [waiting == 0] * len(expected) and heard.drafts == expected
        assert 0 in expected and 3 in expected, "the last row changes as the right row catches up"


def test_cost_curves_price_many_sizes_as_one_at_a_time():
    """``verify_many`` (the budget prices every candidate size in one call) equals ``verify`` size by size, below,
    inside and beyond the measured sizes, for a lone row and for a row's share of a batch."""
    import torch

    from drafttree.budget import BatchShare, CostModel

    curve = CostModel([1, 2, 4, 8, 16, 32], [1.0, 1.1, 1.2, 1.6, 2.3, 3.5])
    ns = torch.arange(1, 80)
    for cost in (curve, BatchShare(curve, 0, 1), BatchShare(curve, 15, 16), BatchShare(curve, 40, 9)):
        many = cost.verify_many(ns).tolist()
        assert many == pytest.approx([cost.verify(int(n)) for n in ns], rel=1e-12, abs=1e-12)


def test_in_a_batch_a_node_must_beat_the_batchs_rate_not_its_rows():
    """Every row waits for the whole round: a node adding 3% to a 16-row forward must be worth 3% of the round's
    tokens. Alone, a 40% node pays (a 2-token forward costs 1.05 single steps); in the batch it must not be verified,
    while a 90% one still is. Expectations computed by hand from the curve, not by budget code."""
    import math

    import torch

    from drafttree.budget import BatchShare, CostModel, TreeBudget

    curve = CostModel([1, 2, 16, 17, 18], [1.0, 1.05, 1.6, 1.65, 1.7])  # past 16 tokens: 0.05 per extra token
    budget = TreeBudget(curve, max_total=8, min_total=1)
    for p, alone, batched in ((0.4, 2, 1), (0.9, 2, 2)):
        scores = torch.tensor([math.log(p)], dtype=torch.float64)
        budget.cost = curve
        assert budget.choose_total(scores, 0.0) == alone
        # 15 other rows, one token each last round: (16 + p) / 1.65 beats 16 / 1.6 only when p > 16 * 0.05 / 1.6 = 0.5
        budget.cost = BatchShare(curve, 15, 16, others_tokens=15.0)
        assert budget.choose_total(scores, 0.0) == batched


def test_a_batchs_measured_excess_and_a_rows_context_move_its_bar():
    """What the curve does not see changes which nodes pay in a batch. The forward measured 2.0 where the curve says
    1.6 (each row attends over its own context): a 0.45 node then pays, since (16 + p) / 2.05 > 16 / 2.0 once
    p > 16 * 0.05 / 2.0 = 0.4 (on the curve alone the bar is 0.5). A row over a long context pays 0.03 more per node
    for attending over it: its bar is 16 * 0.08 / 2.0 = 0.64, so a 0.6 node is not verified. By hand, as above."""
    import math

    import torch

    from drafttree.budget import BatchShare, CostModel, TreeBudget

    curve = CostModel([1, 2, 16, 17, 18], [1.0, 1.05, 1.6, 1.65, 1.7])
    budget = TreeBudget(curve, max_total=8, min_total=1)
    cases = ((0.45, 0.0, 0.0, 1), (0.45, 0.4, 0.0, 2), (0.6, 0.4, 0.03, 1), (0.7, 0.4, 0.03, 2))
    for p, fixed, per_node, size in cases:
        budget.cost = BatchShare(curve, 15, 16, others_tokens=15.0, fixed=fixed, per_node=per_node)
        assert budget.choose_total(torch.tensor([math.log(p)], dtype=torch.float64), 0.0) == size, (p, fixed, per_node)
    share = BatchShare(curve, 15, 16, fixed=0.4, per_node=0.03)
    ns = torch.arange(1, 40)
    assert share.verify_many(ns).tolist() == pytest.approx([share.verify(int(n)) for n in ns], rel=1e-12)


def test_the_batch_decoder_learns_its_forwards_excess_over_the_curve():
    """Per row, a decayed mean of (forward time - curve at its tokens), never below zero."""
    from drafttree.batching.decode import BatchDecoder
    from drafttree.budget import CostModel

    curve = CostModel([1, 2, 16, 17, 18], [1.0, 1.05, 1.6, 1.65, 1.7])
    dec = BatchDecoder(target=None, cost=curve)
    assert dec.excess_per_row is None
    dec._measure_excess(2.0, 16, 16)
    assert dec.excess_per_row == pytest.approx(0.4 / 16)
    dec._measure_excess(1.0, 16, 16)  # faster than the curve: counts as no excess
    assert dec.excess_per_row == pytest.approx(0.8 * 0.4 / 16)
    # what a row adds to a round (what its ending early saves each round): the curve's step there and its excess
    assert dec._row_seconds(17) == pytest.approx(0.05 + 0.8 * 0.4 / 16)
    assert dec._row_seconds(1) == 0.0 and BatchDecoder(target=None)._row_seconds(17) == 0.0
