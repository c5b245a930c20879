"""Drafters, one file each, and the registry that turns a method name (plus options) into one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from drafttree.drafters.base import Drafter, DraftRequest
from drafttree.drafters.options import (
    DraftLMOptions,
    EagleOptions,
    HybridOptions,
    LookupOptions,
    NoOptions,
    SwitchOptions,
    parse_options,
)
from drafttree.errors import DraftTreeError


@dataclass(frozen=True)
class Method:
    """A method name's options schema, what it needs loaded, and how it builds its drafter."""

    schema: type
    needs: str  # "", "head", "draft", "model" (a head or a draft LM) or "any" (whatever is loaded, maybe nothing)
    build: Callable  # (target, draft, head, options) -> Drafter
    doc: str
    head_kinds: tuple[str, ...] = ()  # the head kinds it drafts with (empty: any)

    def fits(self, head) -> bool:
        """Whether it can draft with ``head`` (a head-kind method with another kind of head cannot)."""
        return not self.head_kinds or getattr(head, "kind", "eagle") in self.head_kinds


def _ar(target, draft, head, o):
    return Drafter()


def _lookup(target, draft, head, o: LookupOptions):
    from drafttree.drafters.lookup import LookupDrafter

    return LookupDrafter(o.max_ngram, o.min_ngram, o.num_tokens, o.max_candidates, device=target.device)


def _draft(target, draft, head, o: DraftLMOptions):
    from drafttree.drafters.draft_model import make_draft_drafter

    return make_draft_drafter(target, draft, o)


def _hybrid(target, draft, head, o: HybridOptions):
    from drafttree.drafters.compose import make_hybrid

    return make_hybrid(target, draft, head, o)


def _switch(target, draft, head, o: SwitchOptions):
    from drafttree.drafters.compose import make_switch

    return make_switch(target, draft, head, o)


def _eagle(method: str):
    def build(target, draft, head, o: EagleOptions):
        from drafttree.drafters.eagle import make_eagle_drafter

        return make_eagle_drafter(method, target, head, o)

    return build


REGISTRY: dict[str, Method] = {
    "ar": Method(NoOptions, "", _ar, "plain decoding (one token per target forward)"),
    "lookup": Method(LookupOptions, "", _lookup, "prompt lookup: n-gram matches in the context"),
    "draft": Method(DraftLMOptions, "draft", _draft, "a draft LM's chain or top-k tree"),
    "hybrid": Method(HybridOptions, "any", _hybrid, "n-grams (+ head, draft LM if loaded) in one ranked tree"),
    "switch": Method(SwitchOptions, "model", _switch, "lookup when the context matches, else the model"),
    **{m: Method(EagleOptions, "head", _eagle(m), doc) for m, doc in [
        ("eagle-chain", "EAGLE head, greedy chain"),
        ("eagle1", "EAGLE head, EAGLE-1 static tree"),
        ("eagle2", "EAGLE head, EAGLE-2 dynamic tree"),
        ("eagle-chain-threshold", "EAGLE chain, confidence threshold"),
        ("eagle-chain-ldlp", "EAGLE chain, AdaEAGLE length predictor"),
        ("eagle-chain-ldlp-threshold", "EAGLE chain, LDLP and threshold"),
        ("eagle2-ldlp", "EAGLE-2 tree, depth from the LDLP")]},
    "dflash": Method(EagleOptions, "head", _eagle("dflash"), "DFlash drafter, its whole block as a chain (one drafter "
                     "forward)", head_kinds=("dflash",)),
}
METHODS = list(REGISTRY)
HEAD_METHODS = [m for m, spec in REGISTRY.items() if spec.needs == "head"]
COMPOSED_METHODS = [m for m, spec in REGISTRY.items() if spec.needs in ("model", "any")]  # any loaded head / draft LM


def needs_head(method: str) -> bool:
    return method in HEAD_METHODS


def check_method(method: str) -> Method:
    if method not in REGISTRY:
        if method == "eagle-chain-oracle":
            raise DraftTreeError("eagle-chain-oracle is a measurement: run it with `drafttree bench --methods "
                                 "eagle-chain-oracle`")
        where = "" if method == "auto" else "auto (resolved when a model is loaded), "
        raise DraftTreeError(f"unknown method {method!r}; choose one of {where}{', '.join(METHODS)}")
    return REGISTRY[method]


def make_drafter(method: str, target, draft=None, head=None, **options) -> Drafter:
    """Build the drafter for ``method``. ``target``/``draft`` are LoadedModels, ``head`` an EagleHead."""
    spec = check_method(method)
    opts = parse_options(spec.schema, method, options)
    if spec.needs == "head" and head is None:
        raise DraftTreeError(f"method {method!r} needs an EAGLE head for {target.name!r} (--head PATH)")
    if spec.needs == "draft" and draft is None:
        raise DraftTreeError(f"method {method!r} needs a draft model (--draft-model)")
    if spec.needs == "model" and draft is None and head is None:
        raise DraftTreeError(f"method {method!r} needs an EAGLE head or a draft model (--draft-model)")
    if head is not None and spec.needs == "head" and not spec.fits(head):
        raise DraftTreeError(f"method {method!r} drafts with a {' or '.join(spec.head_kinds)} head; the loaded head "
                             f"({getattr(head, 'path', '?')}) is of kind {getattr(head, 'kind', 'eagle')!r}")
    return spec.build(target, draft, head, opts)


__all__ = ["COMPOSED_METHODS", "DraftRequest", "Drafter", "METHODS", "REGISTRY", "check_method", "make_drafter",
           "needs_head"]
