"""Compose drafters from sources: ``hybrid`` (every source in one ranked tree) and ``switch`` (a baseline)."""

from __future__ import annotations

from drafttree.drafters.hybrid import HybridDrafter, SwitchDrafter
from drafttree.errors import DraftTreeError
from drafttree.sources.model_sources import DraftLMSource, HeadSource, param_count
from drafttree.sources.ngram import NgramSource

SOURCE_NAMES = ("ngram", "head", "draft")


def _int(options: dict, key: str, default: int, low: int = 1) -> int:
    v = options.pop(key, default)
    try:
        v = int(v)
    except (TypeError, ValueError):
        raise DraftTreeError(f"{key} must be an integer, got {v!r}") from None
    if v < low:
        raise DraftTreeError(f"{key} must be >= {low}, got {v}")
    return v


def _bool(v, key: str = "gate") -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise DraftTreeError(f"{key} must be true or false, got {v!r}")


def make_hybrid(target, draft=None, head=None, **options) -> HybridDrafter:
    """n-grams + every loaded model source (EAGLE head, draft LM), merged into one tree per round."""
    from drafttree.budget import TreeBudget
    from drafttree.drafters.eagle import make_budget

    opts = dict(options)
    wanted = str(opts.pop("sources", "ngram+head+draft")).replace(",", "+").split("+")
    bad = [w for w in wanted if w not in SOURCE_NAMES]
    if bad:
        raise DraftTreeError(f"unknown source(s) {', '.join(bad)}; choose from {'+'.join(SOURCE_NAMES)}")
    max_total = _int(opts, "max_total", 64, 2)
    total = opts.pop("total_tokens", "auto")
    budget = None
    if str(total) == "auto":
        base = make_budget(target, max_total=max_total)
        budget = TreeBudget(base.cost, max_total=max_total, min_total=1)
        total = None
    else:
        total = _int({"total_tokens": total}, "total_tokens", 1)
    curve = None if budget is None else (lambda n, c=budget.cost: c.verify(n) / c.verify(1))
    model_kw = dict(top_k=_int(opts, "top_k", 8), depth=_int(opts, "depth", 8), max_total=max_total,
                    cost_curve=curve)
    ngram = NgramSource(max_ngram=_int(opts, "max_ngram", 4), num_tokens=_int(opts, "num_tokens", 12),
                        max_candidates=_int(opts, "max_candidates", 8))
    gate = _bool(opts.pop("gate", True))
    if opts:
        raise DraftTreeError(f"option(s) {', '.join(sorted(opts))} do not apply to method 'hybrid'")
    target_params = param_count(target.model)
    sources = []
    if "ngram" in wanted:
        sources.append(ngram)
    if "head" in wanted and head is not None:
        sources.append(HeadSource(head, **model_kw))
    if "draft" in wanted and draft is not None:
        sources.append(DraftLMSource(draft.model, target.vocab_size, target_params, **model_kw))
    if not sources:
        raise DraftTreeError(f"no source of {'+'.join(wanted)} is loaded")
    if head is not None:
        from drafttree.sources.priors import apply_priors, load_priors

        apply_priors(sources, load_priors(getattr(head, "path", None)))
    return HybridDrafter(sources, budget=budget, total_tokens=total, gate=gate)


def make_switch(target, draft=None, head=None, **options):
    """Prompt lookup when the context matches, else the model drafter (EAGLE-2 with a head, else draft LM)."""
    from drafttree.drafters import make_drafter

    look = {k: options.pop(k) for k in ("max_ngram", "num_tokens", "max_candidates") if k in options}
    if "num_tokens" in look:
        look["k"] = look.pop("num_tokens")
    first = make_drafter("lookup", target, **look)
    if head is not None:
        second = make_drafter("eagle2", target, head=head, **options)
    else:
        second = make_drafter("draft", target, draft, tree=True, total_tokens="auto", **options)
    return SwitchDrafter(first, second)
