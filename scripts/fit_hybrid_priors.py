"""Fit the hybrid drafter's calibration priors for a target + head on its training prompts.

    python scripts/fit_hybrid_priors.py --prompts data/prompts.jsonl --n 32 --max-new-tokens 96 \
        --distilled data/distill.jsonl --out src/drafttree/assets/heads/smollm2-135m-instruct [--temperature 1]

``--temperature 0`` fits the greedy mode (the file's ``sources``), above 0 the sampled mode (``sampled``);
the other mode's fit in an existing file is kept.

Training prompts only (``drafttree data prompts``), never the benchmark tasks; prompts are taken from the
end of the file, spread over its categories by a seeded shuffle. The corpus source's answers come from the same
prompts, so with ``--distilled`` the fit runs on a corpus built from them *without* the fitting prompts' answers
(each would be a hit); without it the source is fitted on the shipped corpus, which flatters it.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

from drafttree.api import SpeculativeModel
from drafttree.sources.corpus import write_corpus
from drafttree.sources.priors import FIT_OPTIONS, PRIORS_FILE, fit_priors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True, help="the head directory to write hybrid-priors.json into")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--distilled", help="the distilled answers the shipped corpus was built from")
    ap.add_argument("--keep-corpus-fit", action="store_true",
                    help="greedy: keep the corpus source's fit already in the file (`drafttree data corpus --priors` "
                         "fits it on 10%% of the answers, far more than these prompts)")
    args = ap.parse_args()
    if args.distilled and not Path(args.distilled).is_file():
        raise SystemExit(f"distilled answers not found: {args.distilled}")
    torch.set_num_threads(2)
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    random.Random(args.seed).shuffle(rows)
    prompts = [[next(m for m in r["messages"] if m["role"] == "user")] for r in rows[: args.n]]
    lm = SpeculativeModel.from_pretrained(args.model, head=args.out, dtype=args.dtype, show_progress=False)
    corpus = None
    if args.distilled:
        corpus = str(Path(tempfile.mkdtemp()) / "corpus.npz")
        fitting = {r["id"] for r in rows[: args.n]}
        kept = Path(corpus).with_suffix(".jsonl")
        with open(args.distilled, encoding="utf-8") as src, open(kept, "w", encoding="utf-8") as out:
            out.writelines(line for line in src if line.strip() and json.loads(line)["id"] not in fitting)
        write_corpus(kept, corpus)
    bar = tqdm(total=len(prompts), desc="fitting hybrid priors")
    fit = fit_priors(lm, prompts, args.max_new_tokens, args.temperature, progress=lambda: bar.update(1),
                     corpus=corpus)
    bar.close()
    fit["meta"] = {"model": args.model, "prompts": str(args.prompts), "n": len(prompts), "seed": args.seed,
                   "max_new_tokens": args.max_new_tokens, "options": FIT_OPTIONS, "dtype": args.dtype,
                   "temperature": args.temperature,
                   "corpus": "without the fitting prompts' answers" if corpus else "the shipped corpus"}
    path = Path(args.out) / PRIORS_FILE
    data = json.loads(path.read_text()) if path.exists() else {}
    if args.temperature > 0:
        data["sampled"] = fit
    else:  # greedy fits of other sources (e.g. the corpus source's, from `drafttree data corpus`) stay
        new = fit.pop("sources")
        if args.keep_corpus_fit and "corpus" in data.get("sources", {}):
            new.pop("corpus", None)
        data.setdefault("sources", {}).update(new)
        data.update(fit)
    path.write_text(json.dumps(data))
    print(f"wrote {Path(args.out) / PRIORS_FILE}")


if __name__ == "__main__":
    main()
