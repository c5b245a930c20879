"""Tree construction invariants: connected, mask = ancestors, positions = depth; builders use the stepper right."""

from __future__ import annotations

import pytest
import torch

from drafttree.tree import (
    EAGLE1_TREE,
    SMALL_TREE,
    DraftTree,
    _closure,
    ancestor_matrix,
    grow_chain,
    grow_dynamic_tree,
    grow_static_tree,
)


class TableStepper:
    """Fake drafter: children log-probs depend on the token only (a fixed random table).

    It records every expansion and checks that the builder's ``attend`` rows are the ancestor sets of the
    expanded slots, as a real drafter's attention would need.
    """

    def __init__(self, vocab: int = 30, seed: int = 0, reduced: bool = False):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.log_softmax(torch.randn(vocab, vocab, generator=g) * 3, -1)
        self.root = 5
        self.vocab_ids = torch.arange(vocab - 1, -1, -1) if reduced else None  # a permuted "reduced" vocab
        self.slot_tokens: list[int] = []
        self.slot_parent: list[int] = []
        self.calls = 0

    def _tok(self, i):
        return i if self.vocab_ids is None else int(self.vocab_ids[i])

    def root_logprobs(self):
        return self.table[self.root] if self.vocab_ids is None else self.table[self.root][self.vocab_ids]

    def expand(self, tokens, parent_slots, attend, depth):
        self.calls += 1
        e = len(self.slot_tokens)
        assert attend.shape == (tokens.numel(), e + tokens.numel())
        for i, (t, ps) in enumerate(zip(tokens.tolist(), parent_slots.tolist())):
            expect = {e + i}
            while ps >= 0:
                expect.add(ps)
                ps = self.slot_parent[ps]
            assert set(torch.nonzero(attend[i]).flatten().tolist()) == expect
            self.slot_tokens.append(t)
            self.slot_parent.append(int(parent_slots[i]))
        rows = self.table[tokens]
        return rows if self.vocab_ids is None else rows[:, self.vocab_ids]


def check_invariants(tree: DraftTree):
    n = tree.size
    assert tree.parents[0] == -1
    assert all(0 <= p < i for i, p in enumerate(tree.parents.tolist()) if i > 0), "topological, connected"
    torch.testing.assert_close(tree.ancestors, ancestor_matrix(tree.parents))
    for i in range(n):
        path = tree.path_to(i)
        assert path[0] == 0 and path[-1] == i
        assert len(path) - 1 == int(tree.depths[i]), "position = depth"
        for a, b in zip(path, path[1:]):
            assert int(tree.parents[b]) == a
    assert tree.ancestors.diagonal().all()


def test_chain_is_a_tree():
    t = DraftTree.chain(3, [4, 5, 6])
    check_invariants(t)
    assert t.parents.tolist() == [-1, 0, 1, 2] and t.depths.tolist() == [0, 1, 2, 3]
    t2 = DraftTree.from_parents(t.tokens, t.parents)
    assert torch.equal(t2.ancestors, t.ancestors)


def test_root_only_trees_share_structure_but_not_their_root():
    a, b = DraftTree.root_only(3), DraftTree.root_only(9)
    check_invariants(a)
    assert a.tokens.tolist() == [3] and b.tokens.tolist() == [9], "each tree keeps its own root token"
    ref = DraftTree.chain(3, [])
    for x, y in ((a.parents, ref.parents), (a.ancestors, ref.ancestors), (a.depths, ref.depths)):
        assert torch.equal(x, y) and x.dtype == y.dtype
    assert a.size == 1 and a.max_depth == 0


@pytest.mark.parametrize("depth,top_k,total", [(1, 4, 5), (3, 3, 8), (5, 4, 20), (6, 8, 40), (4, 10, 200)])
@pytest.mark.parametrize("reduced", [False, True])
def test_dynamic_tree_invariants(depth, top_k, total, reduced):
    st = TableStepper(reduced=reduced)
    tree = grow_dynamic_tree(st, st.root, depth=depth, top_k=top_k, total_tokens=total)
    check_invariants(tree)
    assert tree.size <= total and tree.max_depth <= depth
    assert st.calls == depth - 1, "one batched drafter call per depth after the first"
    # global scores: every node's score is the sum of table log-probs along its path; the kept nodes are
    # the best-scoring candidates, so no dropped candidate of an expanded node beats a kept one
    tok = tree.tokens.tolist()

    def score(i):
        s, node = 0.0, i
        while node > 0:
            s += float(st.table[tok[int(tree.parents[node])], tok[node]])
            node = int(tree.parents[node])
        return s

    kept = [score(i) for i in range(1, tree.size)]
    if tree.size < total:  # everything was kept
        assert tree.size - 1 == top_k + (depth - 1) * top_k * top_k or depth == 1
    else:
        # the root's children not kept must score below the worst kept node
        kids = set(tok[i] for i in range(1, tree.size) if tree.parents[i] == 0)
        lp = st.table[st.root]
        best_dropped = max((float(lp[t]) for t in lp.topk(top_k).indices.tolist() if t not in kids),
                           default=-1e9)
        assert best_dropped <= min(kept) + 1e-6


def test_dynamic_tree_siblings_distinct_and_ordered():
    st = TableStepper(seed=3)
    tree = grow_dynamic_tree(st, st.root, depth=4, top_k=5, total_tokens=30)
    for kids in tree.children():
        toks = [int(tree.tokens[c]) for c in kids]
        assert len(toks) == len(set(toks))


def test_chain_builder():
    st = TableStepper(seed=4)
    tree = grow_chain(st, st.root, 5)
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3, 4]
    # greedy chain: each token is the argmax given the previous
    toks = tree.tokens.tolist()
    for a, b in zip(toks, toks[1:]):
        assert b == int(st.table[a].argmax())


def test_static_tree_shape_eagle1():
    st = TableStepper(seed=5)
    tree = grow_static_tree(st, st.root, EAGLE1_TREE)
    check_invariants(tree)
    assert tree.size == 26
    per_depth = torch.bincount(tree.depths).tolist()
    assert per_depth == [1, 4, 8, 8, 3, 2]
    # node [1, 0] is the top-1 child of the rank-1 child of the root
    root_top = st.table[st.root].topk(4).indices.tolist()
    kids = tree.children()[0]
    assert [int(tree.tokens[c]) for c in kids] == root_top


def test_options_are_validated_once_with_clear_errors():
    from drafttree.drafters.options import EagleOptions, HybridOptions, LookupOptions, parse_options
    from drafttree.errors import DraftTreeError

    assert parse_options(LookupOptions, "lookup", {"k": "5"}).num_tokens == 5  # alias and string
    o = parse_options(EagleOptions, "eagle2", {"top_k_draft": 4, "total_tokens": "auto", "depth": 3.0})
    assert (o.top_k, o.total_tokens, o.depth) == (4, "auto", 3)
    assert parse_options(HybridOptions, "hybrid", {"gate": "off"}).gate is False
    for raw, msg in [({"depth": 2}, "does not apply to method 'lookup'"), ({"k": 2, "num_tokens": 3}, "twice"),
                     ({"max_ngram": 0}, ">= 1"), ({"num_tokens": 2.5}, "integer")]:
        with pytest.raises(DraftTreeError, match=msg):
            parse_options(LookupOptions, "lookup", raw)
    with pytest.raises(DraftTreeError, match="list of paths"):
        parse_options(EagleOptions, "eagle1", {"tree": True})


def test_small_trees_ancestors_on_the_host_equal_the_closure():
    """Trees up to SMALL_TREE nodes get their ancestors row by row on the host: the same matrix as the closure, for
    chains, stars, the root alone and random trees (each node's parent any earlier node)."""
    g = torch.Generator().manual_seed(0)
    shapes = [[-1], list(range(-1, SMALL_TREE - 1)), [-1] + [0] * (SMALL_TREE - 1)]
    for n in range(2, SMALL_TREE + 1):
        for _ in range(20):
            shapes.append([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
    for parents in shapes:
        p = torch.tensor(parents)
        anc = ancestor_matrix(p)
        assert anc.dtype == torch.bool and torch.equal(anc, _closure(p)), parents
    unordered = torch.tensor([-1, 2, 0, 1])  # a child before its parent: the closure takes it
    assert torch.equal(ancestor_matrix(unordered), _closure(unordered))
    big = torch.tensor([-1] + list(range(SMALL_TREE)))  # past the host path: the closure itself
    assert torch.equal(ancestor_matrix(big), torch.ones(SMALL_TREE + 1, SMALL_TREE + 1, dtype=torch.bool).tril())
