"""Split the training prompts around a head's held-out conversations, so that extra data never touches them.

    python scripts/heldout_split.py --distilled data/distill.jsonl --prompts data/prompts.jsonl \
        --eval-samples 96 --eval-after 3874 --train-out data/prompts-train.jsonl \
        --heldout-out data/prompts-heldout.jsonl

The held-out conversations are the ones `drafttree train` holds out with the same --eval-samples/--eval-after/--seed
over the same distilled file (feature samples follow its records one to one). Every prompt whose id owns one of them is
left out of --train-out (use it for sampled answers: `drafttree data distill --temperature 1`) and written to
--heldout-out (use it to fit calibration priors on prompts the head never saw).
"""

from __future__ import annotations

import argparse
import json

from drafttree.train.data import iter_distilled
from drafttree.train.unroll import split_samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--distilled", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--eval-samples", type=int, default=64)
    ap.add_argument("--eval-after", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-out", required=True)
    ap.add_argument("--heldout-out", required=True)
    args = ap.parse_args()
    ids = [rec["id"] for rec in iter_distilled(args.distilled)]
    _, held = split_samples([{"i": i} for i in range(len(ids))], args.eval_samples, args.seed, args.eval_after)
    held_ids = {ids[h["i"]] for h in held}
    counts = [0, 0]
    with (open(args.prompts, encoding="utf-8") as src, open(args.train_out, "w", encoding="utf-8") as train,
          open(args.heldout_out, "w", encoding="utf-8") as heldout):
        for line in src:
            if line.strip():
                out = json.loads(line)["id"] in held_ids
                (heldout if out else train).write(line)
                counts[out] += 1
    print(f"{counts[0]} training prompts -> {args.train_out}; {counts[1]} held-out prompts -> {args.heldout_out}")


if __name__ == "__main__":
    main()
