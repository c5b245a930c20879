"""Drafters, one file each, and the registry that turns a method name into one."""

from __future__ import annotations

from drafttree.drafters.base import Drafter, DraftRequest
from drafttree.errors import DraftTreeError

# Stable method names (CLI, API, benchmark). Each maps to a drafter factory below.
BASE_METHODS = ["ar", "lookup", "draft", "hybrid", "switch"]
HEAD_METHODS = [
    "eagle-chain", "eagle1", "eagle2",
    "eagle-chain-threshold", "eagle-chain-ldlp", "eagle-chain-ldlp-threshold", "eagle2-ldlp",
    "eagle-chain-oracle",
]
METHODS = BASE_METHODS + HEAD_METHODS


def needs_head(method: str) -> bool:
    return method in HEAD_METHODS


# methods that use whatever model sources are loaded (an EAGLE head, a draft LM), and need one of them
COMPOSED_METHODS = ["hybrid", "switch"]
HYBRID_OPTIONS = {"top_k", "top_k_draft", "depth", "max_total", "total_tokens", "gate", "sources", "max_ngram",
                  "num_tokens", "max_candidates"}


# options each method accepts (CLI flags map onto these names)
OPTIONS = {
    "ar": set(),
    "lookup": {"max_ngram", "min_ngram", "num_tokens", "max_candidates", "k"},
    "draft": {"k", "depth", "tree", "top_k", "top_k_draft", "total_tokens", "max_total"},
    "hybrid": HYBRID_OPTIONS,
    "switch": {"max_ngram", "num_tokens", "max_candidates", "top_k", "top_k_draft", "depth", "max_total"},
    **{m: {"k", "depth", "top_k", "top_k_draft", "total_tokens", "max_total", "threshold", "tree", "ldlp",
           "depth_slack"} for m in HEAD_METHODS},
}


def make_drafter(method: str, target, draft=None, head=None, **options) -> Drafter:
    """Build the drafter for ``method``. ``target``/``draft`` are LoadedModels, ``head`` an EagleHead."""
    if method in OPTIONS:
        bad = sorted(set(options) - OPTIONS[method])
        if bad:
            raise DraftTreeError(f"option(s) {', '.join(bad)} do not apply to method {method!r}")
    if "top_k_draft" in options:
        options["top_k"] = options.pop("top_k_draft")
    if method == "ar":
        return Drafter()
    if method == "lookup":
        from drafttree.drafters.lookup import LookupDrafter

        if "k" in options:
            options["num_tokens"] = options.pop("k")
        return LookupDrafter(device=target.device, **options)
    if method in COMPOSED_METHODS:
        from drafttree.drafters.compose import make_hybrid, make_switch

        if draft is None and head is None:
            raise DraftTreeError(f"method {method!r} needs an EAGLE head or a draft model (--draft-model)")
        make = make_hybrid if method == "hybrid" else make_switch
        return make(target, draft, head, **options)
    if method == "draft":
        from drafttree.drafters.draft_model import DraftModelDrafter

        if draft is None:
            raise DraftTreeError("method 'draft' needs a draft model (--draft-model)")
        if options.get("tree") and str(options.get("total_tokens", "")) == "auto":
            from drafttree.drafters.eagle import make_budget

            options["budget"] = make_budget(target, max_total=int(options.pop("max_total", 32)))
        from drafttree.sources.model_sources import param_count

        level = param_count(draft.model) / max(1, param_count(target.model))
        return DraftModelDrafter(draft.model, target.vocab_size, level_cost=level, **options)
    if method in HEAD_METHODS:
        from drafttree.drafters.eagle import make_eagle_drafter

        if head is None:
            raise DraftTreeError(f"method {method!r} needs an EAGLE head for {target.name!r} (--head PATH)")
        return make_eagle_drafter(method, target, head, **options)
    raise DraftTreeError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


__all__ = ["COMPOSED_METHODS", "DraftRequest", "Drafter", "METHODS", "make_drafter", "needs_head"]
