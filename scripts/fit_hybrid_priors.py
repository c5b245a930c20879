"""Fit the hybrid drafter's calibration priors for a target + head on its training prompts.

    python scripts/fit_hybrid_priors.py --prompts data/prompts.jsonl --n 16 \
        --out src/drafttree/assets/heads/smollm2-135m-instruct [--temperature 1]

``--temperature 0`` fits the greedy mode (the file's ``sources``), above 0 the sampled mode (``sampled``);
the other mode's fit in an existing file is kept.

Training prompts only (``drafttree data prompts``), never the benchmark tasks; prompts are taken from the
end of the file, spread over its categories by a seeded shuffle.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from tqdm import tqdm

from drafttree.api import SpeculativeModel
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
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    random.Random(args.seed).shuffle(rows)
    prompts = [[next(m for m in r["messages"] if m["role"] == "user")] for r in rows[: args.n]]
    lm = SpeculativeModel.from_pretrained(args.model, head=args.out, dtype=args.dtype, show_progress=False)
    bar = tqdm(total=len(prompts), desc="fitting hybrid priors")
    fit = fit_priors(lm, prompts, args.max_new_tokens, args.temperature, progress=lambda: bar.update(1))
    bar.close()
    fit["meta"] = {"model": args.model, "prompts": str(args.prompts), "n": len(prompts), "seed": args.seed,
                   "max_new_tokens": args.max_new_tokens, "options": FIT_OPTIONS, "dtype": args.dtype,
                   "temperature": args.temperature}
    path = Path(args.out) / PRIORS_FILE
    data = json.loads(path.read_text()) if path.exists() else {}
    if args.temperature > 0:
        data["sampled"] = fit
    else:  # greedy fits of other sources (e.g. the corpus source's, from `drafttree data corpus`) stay
        data.setdefault("sources", {}).update(fit.pop("sources"))
        data.update(fit)
    path.write_text(json.dumps(data))
    print(f"wrote {Path(args.out) / PRIORS_FILE}")


if __name__ == "__main__":
    main()
