"""Metrics over raw per-prompt records (pure functions; no model needed).

Conventions follow Spec-Bench / EAGLE ``speed.py``:

* per prompt, tokens/s = sum of new tokens / sum of wall time over its turns;
* a method's tokens/s on a task = mean of its per-prompt tokens/s;
* speedup = mean per-prompt tokens/s of the method / that of the baseline (a ratio of means), over the
  prompts both recorded successfully;
* tau = mean accepted tokens per target forward (bonus token included), pooled over every forward of the
  task (Spec-Bench's "#Mean accepted tokens").

The "mean" entry of a method averages its per-task tokens/s, speedups and tau over tasks (the EAGLE-2 paper's
"Mean" column), and sums prompt counts.
"""

from __future__ import annotations

import statistics
from collections import Counter

SPLIT_KEYS = ("prefill", "draft", "verify", "other", "overhead")
MEAN = "mean"


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or of the shorter length's end); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_turns(turns_a: list[list[int]], turns_b: list[list[int]]) -> dict | None:
    """None if every turn's tokens are equal, else ``{"turn": i, "position": p}`` of the first divergence."""
    for i in range(max(len(turns_a), len(turns_b))):
        a = turns_a[i] if i < len(turns_a) else []
        b = turns_b[i] if i < len(turns_b) else []
        p = first_difference(a, b)
        if p is not None:
            return {"turn": i, "position": p}
    return None


def ratio_of_means(values: list[float], base: list[float]) -> float | None:
    if not values or not base:
        return None
    b = statistics.fmean(base)
    return statistics.fmean(values) / b if b > 0 else None


def latest_records(records: list[dict]) -> dict[tuple, dict]:
    """Key (method, task, question_id) -> record; a later line replaces an earlier one (a retried error)."""
    out: dict[tuple, dict] = {}
    for r in records:
        out[(r["method"], r["task"], r["question_id"])] = r
    return out


def _ok(r: dict | None) -> bool:
    return r is not None and not r.get("error")


def _round(x, nd=4):
    return None if x is None else round(float(x), nd)


def reference_method(methods: list[str]) -> str | None:
    """Plain decoding whose outputs define losslessness: our ``ar``, else Hugging Face's ``hf-ar``."""
    for m in ("ar", "hf-ar"):
        if m in methods:
            return m
    return None


def task_metrics(method: str, task: str, recs: dict[tuple, dict], temperature: float, baseline: str | None,
                 reference: str | None) -> dict:
    """Metrics of one method on one task from the latest records."""
    mine = {k[2]: r for k, r in recs.items() if k[0] == method and k[1] == task}
    ok = {q: r for q, r in mine.items() if _ok(r)}
    failed = sorted((str(q) for q, r in mine.items() if not _ok(r)))
    tps = [r["tokens_per_second"] for r in ok.values()]
    out: dict = {"prompts": len(ok), "failed": len(failed)}
    out["tokens_per_second"] = _round(statistics.fmean(tps), 3) if tps else None

    def speedup_vs(base_method):
        if base_method is None:
            return None
        base = {k[2]: r for k, r in recs.items() if k[0] == base_method and k[1] == task and _ok(r)}
        common = [q for q in ok if q in base]
        return _round(ratio_of_means([ok[q]["tokens_per_second"] for q in common],
                                     [base[q]["tokens_per_second"] for q in common]))

    out["speedup"] = speedup_vs(baseline)
    out["speedup_vs_ar"] = speedup_vs("ar") if any(k[0] == "ar" for k in recs) else None
    lengths = [a for r in ok.values() for a in (r.get("accept_lengths") or [])]
    has_tau = bool(ok) and all(r.get("accept_lengths") is not None for r in ok.values())
    out["tau"] = _round(sum(lengths) / len(lengths)) if has_tau and lengths else None
    out["accept_length_hist"] = ({str(k): v for k, v in sorted(Counter(lengths).items())} if has_tau else None)
    new = sum(r["new_tokens"] for r in ok.values())
    fwd = [r.get("target_forwards") for r in ok.values()]
    out["new_tokens"] = new
    out["target_forwards"] = sum(fwd) if fwd and None not in fwd else None
    out["target_forwards_per_token"] = (_round(out["target_forwards"] / new) if out["target_forwards"] is not None
                                        and new else None)
    # accepted draft tokens per target forward by the source(s) that proposed them (a token proposed by several
    # sources counts for each): how much of τ - 1 each source of one merged tree contributes
    by_source = [r.get("source_accepts") for r in ok.values()]
    if by_source and None not in by_source and out["target_forwards"]:
        names = sorted({k for d in by_source for k in d})
        out["source_tau"] = {k: _round(sum(d.get(k, 0) for d in by_source) / out["target_forwards"]) for k in names}
    else:
        out["source_tau"] = None
    wall = sum(r["wall_time"] for r in ok.values())
    out["wall_time"] = _round(wall, 3)
    # every token weighs the same: a short answer (a sample that stopped after a few tokens, all prefill) does not
    # count as much as a long one, as it does in the mean of per-prompt rates
    out["pooled_tokens_per_second"] = _round(new / wall, 3) if wall > 0 else None
    splits = [r.get("time_split") for r in ok.values()]
    if splits and None not in splits:
        secs = {k: sum(s.get(k, 0.0) for s in splits) for k in SPLIT_KEYS}
        out["time_split"] = {k: _round(v, 4) for k, v in secs.items()}
        out["time_split_fraction"] = {k: _round(v / wall if wall > 0 else 0.0, 4) for k, v in secs.items()}
    else:
        out["time_split"] = out["time_split_fraction"] = None
    # losslessness against plain decoding; when sampling, against our `ar` only and for our methods only: a prompt's
    # seed is the same for every method, and it fixes every position's sample (noise.py), while transformers' own
    # methods sample from their own random stream
    out["lossless_reference"] = reference
    out["identical_prompts"] = None
    out["divergences"] = None
    if reference is not None and (temperature == 0 or (reference == "ar" and not method.startswith("hf-"))):
        ref = {k[2]: r for k, r in recs.items() if k[0] == reference and k[1] == task and _ok(r)}
        same, div = 0, []
        for q, r in ok.items():
            if q not in ref:
                continue
            d = compare_turns([t["tokens"] for t in r["turns"]], [t["tokens"] for t in ref[q]["turns"]])
            if d is None:
                same += 1
            else:
                div.append({"question_id": q, **d})
        out["identical_prompts"] = same
        out["compared_prompts"] = same + len(div)
        out["divergences"] = div
    if failed:
        out["failed_ids"] = failed
    return out


def mean_over_tasks(per_task: dict[str, dict]) -> dict:
    rows = [m for m in per_task.values() if m["prompts"]]

    def avg(key):
        vals = [m[key] for m in rows if m.get(key) is not None]
        return _round(statistics.fmean(vals)) if vals else None

    def total(key):
        vals = [m.get(key) for m in rows]
        return None if not vals or None in vals else sum(vals)

    hist: Counter = Counter()
    for m in rows:
        hist.update({int(k): v for k, v in (m.get("accept_length_hist") or {}).items()})
    out = {
        "tasks": len(rows),
        "prompts": sum(m["prompts"] for m in per_task.values()),
        "failed": sum(m["failed"] for m in per_task.values()),
        "tokens_per_second": avg("tokens_per_second"),
        "pooled_tokens_per_second": avg("pooled_tokens_per_second"),
        "speedup": avg("speedup"),
        "speedup_vs_ar": avg("speedup_vs_ar"),
        "tau": avg("tau"),
        "accept_length_hist": {str(k): v for k, v in sorted(hist.items())} or None,
        "target_forwards_per_token": avg("target_forwards_per_token"),
        "identical_prompts": total("identical_prompts"),
        "compared_prompts": total("compared_prompts"),
        "new_tokens": sum(m["new_tokens"] for m in rows),
        "wall_time": _round(sum(m["wall_time"] for m in rows), 3),
    }
    st = [m["source_tau"] for m in rows if m.get("source_tau")]
    out["source_tau"] = ({k: _round(statistics.fmean(d.get(k, 0.0) for d in st)) for k in sorted({k for d in st
                                                                                          for k in d})}
                         if st and len(st) == len(rows) else None)
    fr = [m["time_split_fraction"] for m in rows if m.get("time_split_fraction")]
    out["time_split_fraction"] = ({k: _round(statistics.fmean(f[k] for f in fr)) for k in SPLIT_KEYS}
                                  if fr and len(fr) == len(rows) else None)
    return out


def summarize_results(records: list[dict], methods: list[str], tasks: list[str], temperature: float) -> dict:
    """``{"baseline", "lossless_reference", "results": {method: {task: {...}, "mean": {...}}}}``."""
    recs = latest_records(records)
    present = [m for m in methods if any(k[0] == m for k in recs)]
    baseline = "hf-ar" if "hf-ar" in present else ("ar" if "ar" in present else None)
    reference = reference_method(present)
    results: dict = {}
    for m in present:
        per = {t: task_metrics(m, t, recs, temperature, baseline, reference) for t in tasks}
        per[MEAN] = mean_over_tasks(per)
        results[m] = per
    return {"baseline": baseline, "lossless_reference": reference if temperature == 0 or reference == "ar" else None,
            "results": results}


def median_index(values: list[float]) -> int:
    """Index of the value at the median rank (the lower middle for an even count)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(values) - 1) // 2]
