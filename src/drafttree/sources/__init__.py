"""Candidate sources: small objects that propose scored branches from the current root each round.

One protocol (:class:`~drafttree.sources.base.CandidateSource`), one class per source: context n-grams
(:class:`~drafttree.sources.ngram.NgramSource`), an EAGLE head (:class:`~drafttree.sources.head.HeadSource`)
and a draft LM (:class:`~drafttree.sources.draft_lm.DraftLMSource`). The hybrid drafter merges their
proposals into one tree ranked by calibrated acceptance estimates (``drafttree.drafters.hybrid``).
"""

from drafttree.sources.base import Calibration, CandidateSource, Proposal

__all__ = ["Calibration", "CandidateSource", "Proposal"]
