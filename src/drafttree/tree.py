"""Draft trees: the value passed from drafters to the verifier, and the builders that grow them.

A tree has ``n`` nodes in topological order. Node 0 is the root: the last token already chosen by the
target but not yet in its KV cache. Every other node is a draft token proposed as a continuation of its
parent. A chain is a tree whose parents are -1, 0, 1, 2, ...

Builders are generic over a :class:`TreeStepper` (the EAGLE head or a small draft LM), so one tree
builder serves every drafter:
  * :func:`grow_dynamic_tree` — EAGLE-2: expand the ``top_k`` best frontier nodes per depth by global
    confidence (sum of draft log-probs along the path), then keep the best ``total_tokens`` nodes;
  * :func:`grow_static_tree` — EAGLE-1: a fixed shape given as top-k rank paths;
  * :func:`grow_chain` — the drafter's top-1 chain.
At T > 0 the builders grow the same shapes from the drafter seen through the target's noise
(:class:`~drafttree.noise.CoupledStepper`): every tree is a set of point-mass candidates.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

import torch

SMALL_TREE = 16  # trees up to this size get their ancestors row by row on the host (~5-15 us against ~40-60)


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """``anc[i, j]`` is True when j is i or an ancestor of i (parents before children). A small tree on the host:
    each row is its parent's plus itself; a larger one vectorised, closure by repeated squaring."""
    n = parents.shape[0]
    dev = parents.device
    if n <= SMALL_TREE and dev.type == "cpu":
        rows: list[list[bool]] = []
        for i, p in enumerate(parents.tolist()):
            if p >= i:  # not parents before children: the closure does not need the order
                return _closure(parents)
            row = rows[p].copy() if p >= 0 else [False] * n
            row[i] = True
            rows.append(row)
        return torch.tensor(rows, dtype=torch.bool)
    return _closure(parents)


def _closure(parents: torch.Tensor) -> torch.Tensor:
    n = parents.shape[0]
    dev = parents.device
    adj = torch.eye(n, dtype=torch.float32, device=dev)
    has_parent = parents >= 0
    rows = torch.arange(n, device=dev)[has_parent]
    adj[rows, parents[has_parent]] = 1.0
    steps = max(1, math.ceil(math.log2(max(n, 2))))
    for _ in range(steps):
        nxt = (adj @ adj).clamp_(max=1.0)
        if torch.equal(nxt, adj):
            break
        adj = nxt
    return adj.bool()


_ROOT_ONLY: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [n] long, node 0 is the root
    parents: torch.Tensor  # [n] long, -1 for the root; parents[i] < i
    ancestors: torch.Tensor  # [n, n] bool
    depths: torch.Tensor  # [n] long, root 0
    # sum over draft nodes of exp(score): the draft's own estimate of the accepted length (dynamic trees)
    expected_accept: float | None = None
    scores: torch.Tensor | None = None  # [n] each node's log-estimate of being accepted (root 0), where ranked

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depths.max().item()) if self.size > 1 else 0

    def to(self, device: torch.device) -> DraftTree:
        if self.tokens.device == device:
            return self
        return DraftTree(self.tokens.to(device), self.parents.to(device), self.ancestors.to(device),
                         self.depths.to(device), self.expected_accept,
                         None if self.scores is None else self.scores.to(device))

    @staticmethod
    def from_parents(tokens: torch.Tensor, parents: torch.Tensor) -> DraftTree:
        anc = ancestor_matrix(parents)
        return DraftTree(tokens, parents, anc, anc.sum(1) - 1)

    @staticmethod
    def chain(root: int, drafts: list[int] | torch.Tensor, device="cpu") -> DraftTree:
        drafts = torch.as_tensor(drafts, dtype=torch.long, device=device).reshape(-1)
        n = drafts.numel() + 1
        tokens = torch.cat([torch.tensor([root], dtype=torch.long, device=device), drafts])
        idx = torch.arange(n, device=device)
        return DraftTree(tokens, idx - 1, idx[:, None] >= idx[None, :], idx)

    @staticmethod
    def root_only(root: int, device="cpu") -> DraftTree:
        """The root alone (a plain decoding round). Its structure tensors are shared per device (read-only): a batch
        of 64 rows makes 64 of these a round, and building them afresh was ~1.4% of a 64-user burst's rounds."""
        key = str(device)
        shared = _ROOT_ONLY.get(key)
        if shared is None:
            one = DraftTree.chain(0, [], device)
            shared = _ROOT_ONLY[key] = (one.parents, one.ancestors, one.depths)
        parents, ancestors, depths = shared
        return DraftTree(torch.tensor([root], dtype=torch.long, device=device), parents, ancestors, depths)

    def children(self) -> list[list[int]]:
        """Children of every node, in node order."""
        out: list[list[int]] = [[] for _ in range(self.size)]
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                out[p].append(i)
        return out

    def first_chain(self) -> DraftTree:
        """The chain from the root through each node's best-rated child (``scores``; unranked: its first child, as
        the builders list a node's likelier children first): what a target that verifies chains only
        (chain_target.py) is given of any drafter's tree."""
        if self.size == 1 or self.max_depth == self.size - 1:
            return self
        parents = self.parents.tolist()
        rating = self.scores.tolist() if self.scores is not None else [-float(i) for i in range(self.size)]
        path = [0]
        while True:
            children = [i for i in range(path[-1] + 1, self.size) if parents[i] == path[-1]]
            if not children:
                break
            path.append(max(children, key=lambda i: (rating[i], -i)))
        chain = DraftTree.chain(int(self.tokens[0]), self.tokens[path[1:]], self.tokens.device)
        if self.scores is not None:
            chain.scores = self.scores[path]
            chain.expected_accept = float(chain.scores[1:].exp().sum())
        return chain

    def path_to(self, node: int) -> list[int]:
        """Root-to-node path as node indices."""
        return torch.nonzero(self.ancestors[node]).flatten().tolist()


class TreeStepper(Protocol):
    """What a drafter exposes so that the tree builders can grow trees with it.

    ``root_logprobs()`` returns the draft's log-probabilities for the root's children ([V']); ``expand`` runs
    the drafter on ``k`` new tree nodes at once and returns their children's log-probs ([k, V']).
    ``parent_slots[i]`` is the expansion slot (order of earlier ``expand`` rows, -1 for the root) of node
    i's parent, ``attend[i, j]`` whether new node i sees earlier expanded slot j (its ancestors). V' may be
    a reduced vocabulary: ``vocab_ids`` maps its indices to token ids (None = identity).
    """

    vocab_ids: torch.Tensor | None

    def root_logprobs(self) -> torch.Tensor: ...

    def expand(self, tokens: torch.Tensor, parent_slots: torch.Tensor, attend: torch.Tensor,
               depth: int) -> torch.Tensor: ...


def _to_token_ids(stepper: TreeStepper, idx: torch.Tensor) -> torch.Tensor:
    return idx if stepper.vocab_ids is None else stepper.vocab_ids[idx]


@dataclass
class Candidates:
    """Scored draft candidates from one expansion: node i's token, parent (-1: the root) and score.

    ``cond_logp[i]`` is log P(node i accepted | its parent accepted), ``score[i]`` the sum of ``cond_logp``
    along the path (a child never outscores its parent, so the best N nodes form a connected tree).
    """

    tokens: torch.Tensor  # [m] long
    parents: torch.Tensor  # [m] long, index into these candidates, -1 = root
    cond_logp: torch.Tensor  # [m] float
    score: torch.Tensor  # [m] float
    raw_logp: torch.Tensor  # [m] the drafter's own log-prob of the token given its parent
    levels: int = 0  # drafter calls made beyond the root distribution


def expand_candidates(stepper: TreeStepper, depth: int, top_k: int, calibrate=None, deeper=None) -> Candidates:
    """EAGLE-2 expansion: depth 1 is the root's ``top_k`` children; each further depth expands the ``top_k``
    best frontier nodes (by score) and scores all ``top_k**2`` of their children.

    ``calibrate(raw_logp, depth) -> cond_logp`` maps the drafter's log-probs to acceptance estimates
    (identity by default, as in EAGLE-2); ``deeper(scores, frontier)`` may stop expanding early (False) or
    narrow the level: an int w expands only the w best frontier nodes (the frontier is sorted best first).
    """
    root_lp = stepper.root_logprobs()
    dev = root_lp.device
    k = min(top_k, root_lp.shape[-1])
    lp, idx = root_lp.topk(k)
    raw = lp.clamp(max=0.0).float()
    cond = raw if calibrate is None else calibrate(raw, 1)
    cand_parents = [torch.full((k,), -1, dtype=torch.long, device=dev)]
    frontier = torch.argsort(cond, descending=True, stable=True)  # candidate indices to expand next, best first
    frontier_slot_parent = torch.full((k,), -1, dtype=torch.long, device=dev)  # parent's expansion slot
    expanded_anc = torch.zeros(0, 0, dtype=torch.bool, device=dev)  # ancestry among expanded slots
    n_cand = k
    all_tokens = _to_token_ids(stepper, idx)
    all_raw, all_cond, all_scores = [raw], [cond], cond
    levels = 0
    for d in range(1, depth):
        if deeper is not None:
            go = deeper(all_scores, frontier)
            if not go:
                break
            if go is not True:
                frontier, frontier_slot_parent = frontier[: int(go)], frontier_slot_parent[: int(go)]
        m = frontier.numel()
        e = expanded_anc.shape[0]
        # new slots e..e+m-1 see their parent's ancestry plus themselves
        attend = torch.zeros(m, e + m, dtype=torch.bool, device=dev)
        has_p = frontier_slot_parent >= 0
        if e and has_p.any():
            attend[has_p, :e] = expanded_anc[frontier_slot_parent[has_p]]
        attend[:, e:] = torch.eye(m, dtype=torch.bool, device=dev)
        grown = torch.zeros(e + m, e + m, dtype=torch.bool, device=dev)
        grown[:e, :e] = expanded_anc
        grown[e:] = attend
        expanded_anc = grown
        child_lp = stepper.expand(all_tokens[frontier], frontier_slot_parent, attend, d)  # [m, V']
        levels += 1
        kk = min(top_k, child_lp.shape[-1])
        lp, idx = child_lp.topk(kk, dim=-1)  # [m, kk]
        raw = lp.clamp(max=0.0).float().reshape(-1)
        cond = raw if calibrate is None else calibrate(raw, d + 1)
        scores = all_scores[frontier].repeat_interleave(kk) + cond
        cand_parents.append(frontier.repeat_interleave(kk))
        all_tokens = torch.cat([all_tokens, _to_token_ids(stepper, idx).reshape(-1)])
        all_raw.append(raw)
        all_cond.append(cond)
        all_scores = torch.cat([all_scores, scores])
        if d + 1 < depth:
            best_children = scores.topk(min(top_k, scores.numel())).indices
            frontier = n_cand + best_children
            frontier_slot_parent = e + torch.div(best_children, kk, rounding_mode="floor")
        n_cand += scores.numel()
    return Candidates(all_tokens, torch.cat(cand_parents), torch.cat(all_cond), all_scores, torch.cat(all_raw),
                      levels)


def select_tree(root: int, cands: Candidates, keep: int) -> DraftTree:
    """The tree of the root plus the ``keep`` best-scored candidates (ties keep creation order)."""
    dev = cands.tokens.device
    n_cand = int(cands.tokens.numel())
    keep = max(0, min(keep, n_cand))
    order = torch.sort(cands.score, descending=True, stable=True).indices
    chosen = torch.sort(order[:keep]).values  # creation order is topological
    new_index = torch.full((n_cand,), -1, dtype=torch.long, device=dev)
    new_index[chosen] = torch.arange(1, keep + 1, device=dev)
    par = cands.parents[chosen]
    par_new = torch.where(par >= 0, new_index[par.clamp(min=0)], torch.zeros_like(par))
    if bool((par_new < 0).any()):  # cannot happen with scores <= parent's; guard the invariant anyway
        raise RuntimeError("tree selection is not ancestor-closed")
    tokens = torch.cat([torch.tensor([root], dtype=torch.long, device=dev), cands.tokens[chosen]])
    parents = torch.cat([torch.tensor([-1], dtype=torch.long, device=dev), par_new])
    tree = DraftTree.from_parents(tokens, parents)
    tree.expected_accept = float(cands.score[chosen].exp().sum())
    tree.scores = torch.cat([cands.score.new_zeros(1), cands.score[chosen]])
    return tree


def grow_dynamic_tree(stepper: TreeStepper, root: int, depth: int, top_k: int, total_tokens: int,
                      budget=None) -> DraftTree:
    """EAGLE-2 expand-and-rerank: :func:`expand_candidates`, then the best ``total_tokens - 1`` candidates
    over all depths are verified.

    With a ``budget`` (:class:`drafttree.budget.TreeBudget`), ``depth`` and ``total_tokens`` are upper
    bounds: drafting stops when one more level is not expected to pay for itself, and the verified size
    maximises expected tokens per second on this machine (drafting time measured: it never changes the output).
    """
    clock = time.perf_counter
    t0 = clock()
    deeper = None
    if budget is not None:
        last = [t0]

        def deeper(scores: torch.Tensor, frontier: torch.Tensor) -> bool:
            now = clock()
            level, last[0] = now - last[0], now  # the previous level's drafting time
            if scores.numel() == frontier.numel():  # depth 1 only: always draft depth 2
                return True
            best = torch.sort(scores, descending=True).values
            return budget.worth_deeper(best, scores[frontier], now - t0, level)

    cands = expand_candidates(stepper, depth, top_k, deeper=deeper)
    if budget is not None:
        keep = budget.choose_total(torch.sort(cands.score, descending=True).values, clock() - t0) - 1
    else:
        keep = total_tokens - 1
    return select_tree(root, cands, keep)


# EAGLE-1's default static tree (mc_sim_7b_63): top-k rank paths, 25 draft nodes over 5 depths.
EAGLE1_TREE: list[list[int]] = [
    [0], [1], [2], [3],
    [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
]


def grow_static_tree(stepper: TreeStepper, root: int, paths: list[list[int]]) -> DraftTree:
    """EAGLE-1: a fixed tree shape; node ``[r1, ..., rd]`` is the rank-rd child of node ``[r1..rd-1]``."""
    root_lp = stepper.root_logprobs()
    dev = root_lp.device
    paths = sorted(paths, key=lambda p: (len(p), p))
    index = {(): 0}
    tokens = [root]
    parents = [-1]
    max_rank = max(p[-1] for p in paths) + 1
    level_lp = {(): root_lp}
    slot_of = {}  # path -> expansion slot
    anc_slots: list[list[int]] = []
    by_depth: dict[int, list[list[int]]] = {}
    for p in paths:
        by_depth.setdefault(len(p), []).append(p)
    for d in sorted(by_depth):
        # expand the parents of this depth that are not expanded yet (one batched drafter call)
        need = sorted({tuple(p[:-1]) for p in by_depth[d]} - set(level_lp))
        if need:
            e = len(anc_slots)
            m = len(need)
            attend = torch.zeros(m, e + m, dtype=torch.bool, device=dev)
            parent_slots = []
            for i, q in enumerate(need):
                ps = slot_of.get(q[:-1], -1)
                parent_slots.append(ps)
                row = list(anc_slots[ps]) if ps >= 0 else []
                row.append(e + i)
                attend[i, row] = True
                anc_slots.append(row)
                slot_of[q] = e + i
            toks = torch.tensor([tokens[index[q]] for q in need], dtype=torch.long, device=dev)
            out = stepper.expand(toks, torch.tensor(parent_slots, dtype=torch.long, device=dev), attend, d - 1)
            for i, q in enumerate(need):
                level_lp[q] = out[i]
        tops = {q: _to_token_ids(stepper, level_lp[q].topk(max_rank).indices).tolist()
                for q in {tuple(p[:-1]) for p in by_depth[d]}}
        for p in by_depth[d]:
            q = tuple(p[:-1])
            index[tuple(p)] = len(tokens)
            tokens.append(tops[q][p[-1]])
            parents.append(index[q])
    return DraftTree.from_parents(torch.tensor(tokens, device=dev), torch.tensor(parents, device=dev))


def grow_chain(stepper: TreeStepper, root: int, length: int, stop=None) -> DraftTree:
    """Greedy chain of up to ``length`` draft tokens.

    ``stop(tokens_so_far, cumulative_logprob) -> bool`` may end drafting early (confidence / length
    policies; the benchmark's oracle); every step it saves is one drafter call.
    """
    lp = stepper.root_logprobs()
    dev = lp.device
    tokens: list[int] = []
    cum = 0.0
    for d in range(length):
        j = int(lp.argmax())
        cum += float(lp[j])
        tok = j if stepper.vocab_ids is None else int(stepper.vocab_ids[j])
        tokens.append(tok)
        if d + 1 == length or (stop is not None and stop(tokens, cum)):
            break
        lp = stepper.expand(torch.tensor([tok], device=dev), torch.tensor([d - 1], device=dev),
                            torch.ones(1, d + 1, dtype=torch.bool, device=dev), d + 1)[0]
    return DraftTree.chain(root, tokens, dev)
