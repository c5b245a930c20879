"""The batch pass that drafts several rows' EAGLE heads in one forward per level (batching/head_pass.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from drafttree.batching.head_pass import HeadBatch, HeadRow, PreparedChain, run_packed
from drafttree.drafters.eagle import EagleState
from drafttree.heads.model import EagleHead
from tests.conftest import tiny_causal_lm
from tests.test_eagle3 import _lm
from tests.test_eagle3 import _random_head as _random_eagle3_head


def _eagle1_head(lm) -> EagleHead:
    torch.manual_seed(3)
    head = EagleHead(lm, draft_vocab=torch.arange(2, 50))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return head.eval()


@torch.inference_mode()
def _states(head, width: int, lengths: list[int]) -> list[EagleState]:
    """Rows with committed pasts of different lengths, each with one more chunk queued."""
    g = torch.Generator().manual_seed(7)
    states = []
    for n in lengths:
        s = EagleState(head)
        s.encode(torch.randn(n, width, generator=g), torch.randint(0, 60, (n,), generator=g).tolist(), 0)
        s.flush()
        s.encode(torch.randn(3, width, generator=g), torch.randint(0, 60, (3,), generator=g).tolist(), n)
        states.append(s)
    return states


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
@torch.inference_mode()
def test_packed_rows_equal_each_row_alone(kind):
    """Flush and two chain levels for three rows packed in one forward each give every row's own outputs and
    leave every row's cache as drafting it alone would."""
    if kind == "eagle1":
        lm = tiny_causal_lm("llama", vocab=64, hidden=32, layers=2)
        head, width = _eagle1_head(lm), 32
    else:
        lm = _lm()
        head = _random_eagle3_head(lm)
        width = len(head.aux_layers) * lm.model.config.hidden_size
    alone = _states(head, width, [5, 17, 9])
    packed = copy.deepcopy(alone)
    ref_root, got_root = [], []
    for s in alone:
        s.flush()
        ref_root.append(s.root_feat)
    inputs = [s.flush_input() for s in packed]
    for s, out in zip(packed, run_packed(head, packed, inputs)):
        s.flush_output(out)
        got_root.append(s.root_feat)
    torch.testing.assert_close(torch.stack(got_root), torch.stack(ref_root), atol=1e-5, rtol=1e-5)
    for depth, tokens in ((1, [4, 9, 30]), (2, [7, 7, 12])):
        attend = torch.ones(1, depth, dtype=torch.bool)
        parent = torch.tensor([depth - 2])
        ref = [s.expand_output(s._run(*s.expand_input(torch.tensor([t]), parent, attend, depth)))
               for s, t in zip(alone, tokens)]
        outs = run_packed(head, packed, [s.expand_input(torch.tensor([t]), parent, attend, depth)
                                         for s, t in zip(packed, tokens)])
        got = [s.expand_output(o) for s, o in zip(packed, outs)]
        torch.testing.assert_close(torch.cat(got), torch.cat(ref), atol=1e-5, rtol=1e-5)
    for a, b in zip(alone, packed):
        assert (a.committed, a.pending) == (b.committed, b.pending)
        for la, lb in zip(a.cache.layers, b.cache.layers):
            n = la.get_seq_length()
            assert lb.get_seq_length() == n
            torch.testing.assert_close(lb.keys[..., :n, :], la.keys[..., :n, :], atol=1e-5, rtol=1e-5)


def test_prepared_chain_candidates():
    """The top-k children at each depth, the first of each the parent of the next depth; scores add up."""
    root = torch.log_softmax(torch.tensor([0.0, 3.0, 1.0, 2.0]), -1)
    child = torch.log_softmax(torch.tensor([2.0, 0.0, 0.5, 0.1]), -1)
    prep = PreparedChain(root, [(11, child)])  # the token expanded, a target id (draft id 1)
    cands = prep.candidates(torch.tensor([10, 11, 12, 13]), top_k=2, max_depth=4, calibrate=lambda raw, d: raw)
    assert cands.tokens.tolist() == [11, 13, 10, 12]
    assert cands.parents.tolist() == [-1, -1, 0, 0]
    assert cands.levels == 1
    torch.testing.assert_close(cands.score[2:], cands.score[0] + child.topk(2).values)
    tied = PreparedChain(torch.log_softmax(torch.tensor([0.0, 2.0, 2.0, 1.0]), -1), [(12, child)])
    c2 = tied.candidates(torch.tensor([10, 11, 12, 13]), top_k=2, max_depth=4, calibrate=lambda raw, d: raw)
    assert sorted(c2.tokens[:2].tolist()) == [11, 12]  # a tie: either may come first in the top-k
    assert c2.parents[2:].tolist() == [c2.tokens[:2].tolist().index(12)] * 2  # children hang under the one expanded
    gone = PreparedChain(root, [(99, child)])  # the expanded token is not among the top-k: the chain stops there
    assert gone.candidates(None, top_k=2, max_depth=4, calibrate=lambda raw, d: raw).tokens.numel() == 2
    only_root = prep.candidates(None, top_k=3, max_depth=1, calibrate=lambda raw, d: raw)
    assert only_root.tokens.tolist() == [1, 3, 2] and only_root.levels == 0


class _Source:
    """The little of a HeadSource the batch pass reads."""

    depth = 8

    def __init__(self, head, state):
        self.head, self.state, self.prepared = head, state, None

    def ready_state(self):
        return self.state

    def calibrated(self, raw, depth):
        return raw


@torch.inference_mode()
def test_head_batch_drafts_chains_only_where_they_pay():
    """A row whose bar no chain can reach gets its root's children only; rows with a low bar get deeper chains,
    capped by their own depth and the pass's."""
    lm = tiny_causal_lm("llama", vocab=64, hidden=32, layers=2)
    head = _eagle1_head(lm)
    states = _states(head, 32, [4, 6, 8])
    sources = [_Source(head, s) for s in states]
    hb = HeadBatch(max_depth=4)
    hb.gate.enabled = False
    rows = [HeadRow(sources[0], bar=1.5, max_depth=8), HeadRow(sources[1], bar=1e-12, max_depth=8),
            HeadRow(sources[2], bar=1e-12, max_depth=2)]
    assert hb.draft(rows, batch_rows=3) > 0 and hb.passes == 1
    assert [len(s.prepared.levels) for s in sources] == [0, 3, 1]
    assert [s.pending for s in states] == [0, 3, 1]


@torch.inference_mode()
def test_head_batch_encodes_a_long_newcomer_as_its_first_draft_alone_would():
    """A newcomer's long prompt (more than 128 pairs) is encoded beside the running rows' short backlogs: every row's
    state (committed pairs, root feature) is what flushing it alone gives (the lone path encodes a long backlog as a
    prefill)."""
    lm = tiny_causal_lm("llama", vocab=64, hidden=128, layers=2)  # head_dim 32: the prompt kernel's shape
    head = _eagle1_head(lm)
    states = _states(head, 128, [4, 6])
    g = torch.Generator().manual_seed(11)
    newcomer = EagleState(head)
    newcomer.encode(torch.randn(300, 128, generator=g), torch.randint(0, 60, (300,), generator=g).tolist(), 0)
    states.append(newcomer)
    alone = copy.deepcopy(states)
    for s in alone:
        s.flush()
    hb = HeadBatch(max_depth=2)
    hb.gate.enabled = False
    hb.draft([HeadRow(_Source(head, s), bar=1e-12, max_depth=2) for s in states], batch_rows=3)
    for a, s in zip(alone, states):
        assert s.committed == a.committed
        torch.testing.assert_close(s.root_feat, a.root_feat, atol=1e-5, rtol=1e-5)
