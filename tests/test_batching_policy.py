"""DraftOrPlain: per batch size, the better of drafting and plain rounds, with probes of the other."""

from drafttree.batching.policy import DraftOrPlain, bucket


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
    assert choices[:5] == [False] * 4 + [True], "a batch starts plain and probes drafting after the wait"
    assert sum(choices) < 12, "plain rounds pay more here: drafting only as probes"
    gaps = [i for i, c in enumerate(choices) if c][2:]
    assert gaps[-1] - gaps[-2] > gaps[1] - gaps[0], "failed probes wait longer and longer"
    assert sum(run(DraftOrPlain(), 16, {True: 5.0, False: 2.0}, 100)) > 85  # drafting pays: mostly drafting
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
