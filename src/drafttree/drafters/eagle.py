"""EAGLE drafting with a trained head: chain (``eagle-chain``), EAGLE-1 static tree (``eagle1``) and
EAGLE-2 dynamic tree (``eagle2``), plus the AdaEAGLE length policies.

The head keeps its own KV cache of *committed* pairs (target feature at t, token t+1). Each round it
re-encodes the pairs the target just accepted with the target's true features (``observe``), whose last
output is the predicted feature of the new root; drafting then appends uncommitted tree slots, which
the next ``observe`` drops, so drafting branches never pollute the committed cache.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from drafttree.accept import warp_probs
from drafttree.budget import TreeBudget, cost_model_for
from drafttree.drafters.base import Drafter, DraftRequest
from drafttree.errors import DraftTreeError
from drafttree.heads.model import EagleHead
from drafttree.target import tree_attention_mask
from drafttree.tree import (
    EAGLE1_TREE,
    DraftTree,
    grow_chain,
    grow_dynamic_tree,
    grow_sampled_chain,
    grow_static_tree,
)


class EagleState:
    """The head's cache, committed length and the predicted feature of the current root (a TreeStepper)."""

    def __init__(self, head: EagleHead):
        self.head = head
        self.vocab_ids = head.draft_vocab.to(head.fc.weight.device) if head.draft_vocab is not None else None
        self.cache: DynamicCache | None = None
        self.committed = 0
        self.pending = 0
        self.root_pos = 0
        self.root_feat: torch.Tensor | None = None
        self._root_lp: torch.Tensor | None = None
        self.slot_feats: list[torch.Tensor] = []  # predicted features of this round's expanded slots

    def _run(self, feats: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor):
        mask = tree_attention_mask(attend, self.committed, self.head.fc.weight.dtype)
        out = self.head(feats[None], ids[None], positions[None], mask, self.cache)
        return out[0]

    def _crop(self) -> None:
        if self.pending:
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, : self.committed]
                layer.values = layer.values[:, :, : self.committed]
            self.pending = 0
        self.slot_feats = []

    @torch.inference_mode()
    def encode(self, feats: torch.Tensor, next_ids: list[int], start: int) -> None:
        """Commit true pairs (feature t, token t+1) for positions start.. and predict the next root feature."""
        if self.cache is None:
            self.cache = DynamicCache()
        self._crop()
        dev = self.head.fc.weight.device
        n = len(next_ids)
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=dev))
        out = self._run(feats.to(dev), torch.tensor(next_ids, device=dev), torch.arange(start, start + n, device=dev),
                        causal)
        self.committed += n
        self.root_pos = start + n
        self.root_feat = out[-1]
        self._root_lp = None

    # -- TreeStepper -----------------------------------------------------------------------------------
    def root_logprobs(self) -> torch.Tensor:
        if self._root_lp is None:
            self._root_lp = torch.log_softmax(self.head.draft_logits(self.root_feat).float(), dim=-1)
        return self._root_lp

    @torch.inference_mode()
    def expand(self, tokens: torch.Tensor, parent_slots: torch.Tensor, attend: torch.Tensor, depth: int):
        feats = torch.stack([self.root_feat if s < 0 else self.slot_feats[s] for s in parent_slots.tolist()])
        pos = torch.full((tokens.numel(),), self.root_pos + depth - 1, dtype=torch.long, device=feats.device)
        out = self._run(feats, tokens.to(feats.device), pos, attend)
        self.pending += tokens.numel()
        self.slot_feats.extend(out.unbind(0))
        return torch.log_softmax(self.head.draft_logits(out).float(), dim=-1)


class EagleDrafter(Drafter):
    """``shape``: 'chain' (top-1 chain, sampled at T > 0), 'static' (EAGLE-1 tree) or 'dynamic' (EAGLE-2)."""

    def __init__(self, head: EagleHead, shape: str = "dynamic", depth: int = 6, top_k: int = 8,
                 total_tokens: int | str = "auto", tree: list[list[int]] | None = None, name: str | None = None,
                 budget=None, length_policy: str | None = None, threshold: float = -1.0, ldlp=None,
                 depth_slack: int = 1):
        if shape not in ("chain", "static", "dynamic"):
            raise DraftTreeError(f"unknown EAGLE draft shape {shape!r}")
        if depth is None or int(depth) <= 0:
            raise DraftTreeError(f"depth must be > 0, got {depth}")
        self.head, self.shape = head, shape
        self.depth, self.top_k = int(depth), int(top_k)
        if total_tokens != "auto" and (not str(total_tokens).isdigit() or int(total_tokens) < 1):
            raise DraftTreeError(f"total_tokens must be a positive integer or 'auto', got {total_tokens!r}")
        self.total_tokens = total_tokens if total_tokens == "auto" else int(total_tokens)
        self.budget = budget if self.total_tokens == "auto" and shape == "dynamic" else None
        if self.total_tokens == "auto" and shape == "dynamic" and budget is None:
            raise DraftTreeError("total_tokens='auto' needs a TreeBudget (make_eagle_drafter builds one)")
        self._round = None
        self.tree = tree or EAGLE1_TREE
        if length_policy not in (None, "threshold", "ldlp", "ldlp-threshold", "oracle"):
            raise DraftTreeError(f"unknown length policy {length_policy!r}")
        if length_policy in ("ldlp", "ldlp-threshold") and ldlp is None:
            raise DraftTreeError(f"length policy {length_policy!r} needs a trained length predictor (LDLP)")
        self.length_policy, self.threshold, self.ldlp = length_policy, float(threshold), ldlp
        self.depth_slack = depth_slack  # eagle2-ldlp: tree depth = predicted chain length + slack
        self.reference: list[int] | None = None  # oracle only: the target's own greedy continuation
        # oracle only: context -> the target's greedy continuation of it, to re-derive the reference when the
        # output left it (in bf16 a tree verify can flip a near-tie that plain decoding resolved the other way)
        self.reference_fn = None
        self._last = None  # (token, feature) of the last token the target validated, for the LDLP
        self.name = name or {"chain": "eagle-chain", "static": "eagle1", "dynamic": "eagle2"}[shape]
        self.state = EagleState(head)
        self._seeded_budget: TreeBudget | None = None

    def begin(self, prompt: torch.Tensor, prefill_features: torch.Tensor, root: int) -> None:
        self.state = EagleState(self.head)
        self._seeded_budget = None  # a seeded generation starts from a fresh budget state of its own
        ids = prompt.reshape(-1).tolist()
        self._last = (ids[-1], prefill_features[-1])
        self.state.encode(prefill_features, ids[1:] + [root], 0)

    def observe(self, committed: list[int], features: torch.Tensor, next_root: int) -> None:
        if self.budget is not None and self._round is not None:
            expected, t_start, t_draft, n = self._round
            verify = self.budget.cost.verify(n)
            if self._seeded_budget is not None:  # counters only: no measured time enters a seeded run
                self._seeded_budget.observe(expected, len(committed) - 1, t_draft + verify, t_draft, verify)
            else:
                now = time.perf_counter()
                self.budget.observe(expected, len(committed) - 1, now - t_start, t_draft, verify)
            self._round = None
        self._last = (committed[-1], features[-1])
        self.state.encode(features, committed[1:] + [next_root], self.state.root_pos)

    def predicted_length(self) -> int:
        tok, feat = self._last
        dev = self.head.fc.weight.device
        emb = self.head.embed_tokens(torch.tensor(tok, device=dev))
        return self.ldlp.predict(emb.float(), feat.float())

    def round_depth(self, req: DraftRequest) -> int:
        """The draft depth for this round: fixed, or the LDLP's prediction (plus slack for trees)."""
        depth = self.depth
        if self.length_policy == "ldlp" or (self.length_policy == "ldlp-threshold" and self.shape != "chain"):
            k = self.predicted_length()
            req.info["predicted_length"] = k
            depth = k if self.shape == "chain" else max(1, k + self.depth_slack)
        return min(depth, req.max_depth)

    def stop_rule(self, req: DraftRequest):
        """Chain early-stopping rule of the length policy (None: draft the full depth)."""
        policy = self.length_policy
        if policy == "threshold":
            return lambda n, cum: cum < self.threshold
        if policy == "ldlp-threshold":  # AdaEAGLE-DDD: stop only when both say stop
            k = self.predicted_length()
            req.info["predicted_length"] = k
            return lambda n, cum: n >= k and cum < self.threshold
        return None

    def propose(self, req: DraftRequest) -> DraftTree:
        depth = self.round_depth(req)
        if depth <= 0:
            return DraftTree.root_only(req.root)
        st = self.state
        if self.shape == "dynamic":
            t0 = time.perf_counter()
            budget, level = self.budget, None
            if budget is not None and req.reproducible:
                if self._seeded_budget is None:
                    self._seeded_budget = TreeBudget(budget.cost, max_total=budget.max_total)
                budget = self._seeded_budget
                level = self.head.level_cost() * budget.cost.verify(1)  # modelled, not measured
            total = self.total_tokens if budget is None else budget.max_total
            tree = grow_dynamic_tree(st, req.root, depth, self.top_k, total, budget=budget, level_seconds=level)
            if budget is not None:
                t_draft = time.perf_counter() - t0 if level is None else level * (tree.max_depth + 1)
                self._round = (tree.expected_accept or 0.0, t0, t_draft, tree.size)
                req.info.update(tree_tokens=tree.size, depth=tree.max_depth,
                                calibration=round(budget.calibration, 3))
            return tree
        if self.shape == "chain":
            if not req.sampling.greedy:
                return grow_sampled_chain(st, req.root, depth, lambda lp: warp_probs(lp, req.sampling),
                                          req.generator, self.head.lm_head.weight.shape[0])
            if self.length_policy == "oracle":
                return self._oracle_chain(req, depth)
            tree = grow_chain(st, req.root, depth, stop=self.stop_rule(req))
            req.info["drafted"] = tree.size - 1
            return tree
        paths = [p for p in self.tree if len(p) <= depth]
        return grow_static_tree(st, req.root, paths)

    def _oracle_chain(self, req: DraftRequest, depth: int) -> DraftTree:
        """Measurement only: draft until the first token the target will reject (known from a reference
        run of plain decoding) and drop it: the chain length an oracle would choose."""
        ref = self.reference or []
        start = len(req.context)  # reference index of the first draft token (the root is context[-1])
        if self.reference_fn is not None and ref[:start] != req.context:
            t0 = time.perf_counter()
            self.reference = ref = list(req.context) + self.reference_fn(list(req.context))
            req.info["untimed"] = time.perf_counter() - t0  # the decode loop leaves it out of its clock
        st = self.state
        dev = self.head.fc.weight.device
        lp = st.root_logprobs()
        toks: list[int] = []
        drafted = 0
        for d in range(depth):
            if start + d >= len(ref):
                break
            j = int(lp.argmax())
            tok = j if st.vocab_ids is None else int(st.vocab_ids[j])
            drafted += 1
            if tok != ref[start + d]:
                break
            toks.append(tok)
            if d + 1 == depth:
                break
            lp = st.expand(torch.tensor([tok], device=dev), torch.tensor([d - 1], device=dev),
                           torch.ones(1, d + 1, dtype=torch.bool, device=dev), d + 1)[0]
        req.info["drafted"] = drafted
        return DraftTree.chain(req.root, toks, dev)


def make_budget(target, max_total: int = 64) -> TreeBudget:
    """A TreeBudget with this machine's verify-cost curve for ``target`` (measured once, then cached)."""
    from drafttree.target import TargetModel

    return TreeBudget(cost_model_for(TargetModel(target.model), target.name), max_total=max_total)


CHAIN_MAX = 8  # k_max of the adaptive chain policies


def _ldlp_for(head: EagleHead, options: dict):
    if options.get("ldlp") is not None:
        return options.pop("ldlp")
    from drafttree.heads.length import load_length_predictor

    path = getattr(head, "path", None)
    if path is None:
        raise DraftTreeError("this head has no length predictor (LDLP) next to it; train one with "
                             "`drafttree train-length`")
    return load_length_predictor(path, head.config.hidden_size)


def make_eagle_drafter(method: str, target, head: EagleHead, **options) -> Drafter:
    """EAGLE drafters by method name; options override the defaults (depth, top_k, total_tokens, ...)."""
    if "top_k_draft" in options:
        options["top_k"] = options.pop("top_k_draft")
    if "k" in options:
        options.setdefault("depth", options.pop("k"))
    threshold = options.pop("threshold", None)
    thr = {} if threshold is None else {"threshold": threshold}
    if method == "eagle-chain":
        return EagleDrafter(head, "chain", **{"depth": 4, **options}, name=method)
    if method == "eagle1":
        return EagleDrafter(head, "static", **{"depth": 5, **options}, name=method)
    if method in ("eagle2", "eagle2-ldlp"):
        opts = {"top_k": 8, "depth": 8, **options}
        if str(opts.get("total_tokens", "auto")) == "auto":
            opts["total_tokens"] = "auto"
            opts["budget"] = make_budget(target, max_total=opts.pop("max_total", 64))
        if method == "eagle2-ldlp":
            opts.update(length_policy="ldlp", ldlp=_ldlp_for(head, opts))
        return EagleDrafter(head, "dynamic", **opts, name=method)
    chain = {"depth": CHAIN_MAX, **options}
    if method == "eagle-chain-threshold":
        return EagleDrafter(head, "chain", **chain, length_policy="threshold", name=method, **thr)
    if method == "eagle-chain-ldlp":
        return EagleDrafter(head, "chain", **chain, length_policy="ldlp", ldlp=_ldlp_for(head, chain), name=method)
    if method == "eagle-chain-ldlp-threshold":
        return EagleDrafter(head, "chain", **chain, length_policy="ldlp-threshold", ldlp=_ldlp_for(head, chain),
                            name=method, **thr)
    if method == "eagle-chain-oracle":
        return EagleDrafter(head, "chain", **chain, length_policy="oracle", name=method)
    raise DraftTreeError(f"unknown EAGLE method {method!r}")
