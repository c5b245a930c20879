"""Calibration priors fitted offline: where each source's acceptance estimates start.

Every source's calibration starts from these priors and keeps learning across generations. Priors are fitted on the
head's *training* prompts (never the benchmark tasks) by decoding with big trees and every gate open, so that every
cell gets tested, then stored next to the head as ``hybrid-priors.json``: per source, hits and trials per calibration
cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

PRIORS_FILE = "hybrid-priors.json"
FIT_OPTIONS = {"gate": False, "total_tokens": 24}


MODES = ("greedy", "sampled")
_LOADED: dict[tuple, dict] = {}  # (file, mtime, size) -> load_priors' result


def _parse(sources: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {name: (torch.tensor(d["hits"], dtype=torch.float64), torch.tensor(d["trials"], dtype=torch.float64))
            for name, d in sources.items()}


def load_priors(head_dir: str | Path | None) -> dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Fitted (hits, trials) per sampling mode and source name ({} when none ship with the head).

    The file holds the greedy (T=0) fit under ``sources`` and, when fitted, the sampled one under
    ``sampled.sources``; a mode without a fit keeps the built-in defaults.
    """
    if head_dir is None or not (Path(head_dir) / PRIORS_FILE).exists():
        return {}
    path = Path(head_dir) / PRIORS_FILE
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _LOADED:  # read once per file version: every batched request makes a drafter (~1.6 ms a read)
        data = json.loads(path.read_text())
        out = {"greedy": _parse(data["sources"])}
        if "sampled" in data:
            out["sampled"] = _parse(data["sampled"]["sources"])
        if len(_LOADED) >= 16:
            _LOADED.clear()
        _LOADED[key] = out
    return _LOADED[key]  # shared: apply_priors reads the tensors and never writes them


def apply_priors(calibrations: dict[str, list], names: list[str], priors: dict, strength: float = 8.0) -> None:
    """Blend each calibration's default prior with its fitted hits/trials (``strength`` pseudo-trials of the
    default); ``calibrations`` maps a mode to one calibration per source, ``names`` the sources' names."""
    for mode, cals in calibrations.items():
        fitted = priors.get(mode, {})
        for name, cal in zip(names, cals):
            if name not in fitted:
                continue
            hits, trials = fitted[name]
            if hits.shape == cal.prior.shape:
                default = cal.default[0]
                cal.prior = ((hits + strength * default) / (trials + strength)).clamp(cal.floor, 1 - cal.floor)
                cal.strength = strength
            elif hits.numel() == getattr(cal, "base_cells", -1):  # a fit of the plain layout, split by noise bin
                base = cal.base_default
                cal.set_base_prior(((hits + strength * base) / (trials + strength)).clamp(cal.floor, 1 - cal.floor),
                                   strength)
            # else fitted for another cell layout: keep the defaults


def fit_priors(model, prompts: list, max_new_tokens: int = 128, temperature: float = 0.0, progress=None,
               corpus: str | None = None) -> dict:
    """Decode ``prompts`` with the hybrid (big trees, gates open) at ``temperature`` and sum every source's
    observations; the result is the file's entry for that mode (greedy at 0, sampled above). ``corpus``: the
    corpus source's file, which must not hold these prompts' own answers (each would be a hit)."""
    options = dict(FIT_OPTIONS, **({"corpus": corpus} if corpus else {}))
    drafter = model.drafter("hybrid", dict(options))
    for cals in drafter.calibrations.values():  # fit from the built-in defaults, not from priors fitted earlier
        for cal in cals:
            cal.prior, cal.strength = cal.default[0].clone(), cal.default[1]
    mode = "greedy" if temperature == 0 else "sampled"
    totals: dict[str, list[torch.Tensor]] = {}
    for i, p in enumerate(prompts):
        for cal in drafter.calibrations[mode]:  # a generation that never drafts must not count the last again
            cal.reset()
        # each generation starts from the defaults (reset above), so its counts are its own
        model.generate(p, max_new_tokens=max_new_tokens, method="hybrid", method_options=dict(options),
                       temperature=temperature, seed=i)
        for s, cal in zip(drafter.sources, drafter.calibrations[mode]):
            h, t = totals.setdefault(s.name, [torch.zeros_like(cal.hits), torch.zeros_like(cal.trials)])
            h += cal.hits
            t += cal.trials
        if progress is not None:
            progress()
    return {"sources": {name: {"hits": h.tolist(), "trials": t.tolist()} for name, (h, t) in totals.items()}}
