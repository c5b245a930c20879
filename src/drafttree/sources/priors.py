"""Calibration priors fitted offline: where each source's acceptance estimates start every generation.

Seeded generations start from these priors (so that they reproduce); unseeded ones keep learning across
generations. Priors are fitted on the head's *training* prompts (never the benchmark tasks) by decoding
with big trees and every gate open, so that every cell gets tested, then stored next to the head as
``hybrid-priors.json``: per source, hits and trials per calibration cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

PRIORS_FILE = "hybrid-priors.json"
FIT_OPTIONS = {"gate": False, "total_tokens": 24}


def load_priors(head_dir: str | Path | None) -> dict[str, torch.Tensor]:
    """Fitted acceptance rates per source name ({} when none ship with the head)."""
    if head_dir is None or not (Path(head_dir) / PRIORS_FILE).exists():
        return {}
    data = json.loads((Path(head_dir) / PRIORS_FILE).read_text())
    out = {}
    for name, d in data["sources"].items():
        out[name] = (torch.tensor(d["hits"], dtype=torch.float64), torch.tensor(d["trials"], dtype=torch.float64))
    return out


def apply_priors(sources, priors: dict, strength: float = 8.0) -> None:
    """Blend each source's default prior with its fitted hits/trials (``strength`` pseudo-trials of default)."""
    for s in sources:
        if s.name in priors:
            hits, trials = priors[s.name]
            cal = s.calibration
            if hits.shape != cal.prior.shape:
                continue  # fitted for another cell layout: keep the defaults
            cal.prior = ((hits + strength * cal.prior) / (trials + strength)).clamp(cal.floor, 1 - cal.floor)
            cal.strength = strength


def fit_priors(model, prompts: list, max_new_tokens: int = 128, progress=None) -> dict:
    """Decode ``prompts`` with the hybrid (big trees, gates open) and sum every source's observations."""
    drafter = model.drafter("hybrid", dict(FIT_OPTIONS))
    for s in drafter.sources:  # fit from the built-in defaults, not from priors fitted earlier
        s.calibration.prior, s.calibration.strength = s.calibration.default[0].clone(), s.calibration.default[1]
    totals: dict[str, list[torch.Tensor]] = {}
    for p in prompts:
        for s in drafter.sources:  # a generation that never drafts must not count the previous one again
            s.calibration.reset()
        # seeded: each generation starts from the defaults, so its counts are its own
        model.generate(p, max_new_tokens=max_new_tokens, method="hybrid", method_options=dict(FIT_OPTIONS), seed=0)
        for s in drafter.sources:
            cal = s.calibration
            h, t = totals.setdefault(s.name, [torch.zeros_like(cal.hits), torch.zeros_like(cal.trials)])
            h += s.calibration.hits
            t += s.calibration.trials
        if progress is not None:
            progress()
    return {"sources": {name: {"hits": h.tolist(), "trials": t.tolist()} for name, (h, t) in totals.items()}}
