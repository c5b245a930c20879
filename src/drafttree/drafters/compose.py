"""Compose drafters from sources: ``hybrid`` (every source in one ranked tree) and ``switch`` (a baseline)."""

from __future__ import annotations

from drafttree.budget import check_prune_rule
from drafttree.drafters.draft_model import param_count
from drafttree.drafters.hybrid import HybridDrafter, SwitchDrafter
from drafttree.drafters.options import AUTO, DraftLMOptions, HybridOptions, SwitchOptions, parse_options
from drafttree.errors import DraftTreeError
from drafttree.live_curve import LiveCurve
from drafttree.sources.model_sources import AssistantSource, DFlashSource, DraftLMSource, HeadSource
from drafttree.sources.ngram import NgramSource

SOURCE_NAMES = ("ngram", "corpus", "head", "draft")


def make_hybrid(target, draft=None, head=None, o: HybridOptions | None = None) -> HybridDrafter:
    """n-grams + every loaded model source (EAGLE head, draft LM), merged into one tree per round."""
    from drafttree.drafters.eagle import make_budget

    o = o or HybridOptions()
    wanted = o.sources.replace(",", "+").split("+")
    bad = [w for w in wanted if w not in SOURCE_NAMES]
    if bad:
        raise DraftTreeError(f"unknown source(s) {', '.join(bad)}; choose from {'+'.join(SOURCE_NAMES)}")
    check_prune_rule(o.prune_against)
    budget = make_budget(target, max_total=o.max_total, min_total=1) if o.total_tokens == AUTO else None
    if budget is not None and o.floored_curve:
        budget.cost = budget.cost.floored()
    live = LiveCurve(budget.cost) if budget is not None and o.live_curve else None
    if live is not None:  # the model sources' level costs follow the corrected curve too
        curve = lambda n: live.curve.verify(n) / live.curve.verify(1)  # noqa: E731
    else:
        curve = None if budget is None else (lambda n, c=budget.cost: c.verify(n) / c.verify(1))
    model_kw = dict(top_k=o.top_k, depth=o.depth, max_total=o.max_total, cost_curve=curve,
                    prune_against=o.prune_against, explore=o.explore)
    sources = []
    if "ngram" in wanted:
        sources.append(NgramSource(max_ngram=o.max_ngram, num_tokens=o.num_tokens, max_candidates=o.max_candidates))
    if "corpus" in wanted:
        corpus = _corpus_source(target, head, o)
        if corpus is not None:
            sources.append(corpus)
    if "head" in wanted and head is not None:
        kind = getattr(head, "kind", "eagle")
        source = {"assistant": AssistantSource, "dflash": DFlashSource}.get(kind, HeadSource)
        sources.append(source(head, **model_kw))
    if "draft" in wanted and draft is not None:
        sources.append(DraftLMSource(draft.model, target.vocab_size, param_count(target.model), extend=o.extend,
                                     window=o.draft_window, **model_kw))
    if not sources:
        raise DraftTreeError(f"no source of {'+'.join(wanted)} is loaded")
    total = None if budget is not None else o.total_tokens
    drafter = HybridDrafter(sources, budget=budget, total_tokens=total, gate=o.gate,
                            costly_in_batches=o.costly_in_batches, batch_pass=o.batch_pass, agree=o.agree,
                            clock_cost=o.clock_cost, live=live, batch_pack=o.batch_pack, noise_cells=o.noise_cells)
    drafter.draft_gate.enabled = o.gate and o.draft_gate
    drafter.greedy_draft_gate.enabled = o.gate and o.greedy_gate
    if head is not None:
        from drafttree.sources.priors import apply_priors, load_priors

        apply_priors(drafter.calibrations, [s.name for s in sources], load_priors(getattr(head, "path", None)))
    return drafter


def _corpus_source(target, head, o: HybridOptions):
    """Retrieval from the corpus file given (``corpus=PATH``) or shipped next to the head; None without one."""
    from pathlib import Path

    from drafttree.sources.corpus import CORPUS_FILE, CorpusSource, load_corpus

    path = o.corpus
    if path is None and getattr(head, "path", None) is not None and (Path(head.path) / CORPUS_FILE).exists():
        path = Path(head.path) / CORPUS_FILE
    if path is None:
        return None
    index = load_corpus(str(path))
    if index.vocab > target.vocab_size:
        raise DraftTreeError(f"corpus {path} holds token id {index.vocab - 1}, beyond {target.name}'s vocabulary "
                             f"({target.vocab_size}): it was built with another tokenizer")
    return CorpusSource(index, num_tokens=o.num_tokens, max_candidates=o.max_candidates)


def make_switch(target, draft=None, head=None, o: SwitchOptions | None = None) -> SwitchDrafter:
    """Prompt lookup when the context matches, else the model drafter (EAGLE-2 with a head, else draft LM)."""
    from drafttree.drafters.draft_model import make_draft_drafter
    from drafttree.drafters.eagle import make_eagle_drafter
    from drafttree.drafters.lookup import LookupDrafter

    o = o or SwitchOptions()
    first = LookupDrafter(o.max_ngram, 1, o.num_tokens, o.max_candidates, device=target.device)
    model = {k: v for k, v in (("top_k", o.top_k), ("depth", o.depth), ("max_total", o.max_total)) if v is not None}
    if head is not None:
        second = make_eagle_drafter("eagle2", target, head, model)
    else:
        second = make_draft_drafter(target, draft, parse_options(DraftLMOptions, "switch", {
            "tree": True, "total_tokens": AUTO, **model}))
    return SwitchDrafter(first, second)
