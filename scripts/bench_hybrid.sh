#!/usr/bin/env bash
# The hybrid runs at the top of docs/benchmarks.md (resumable: re-run with larger PROMPTS to add prompts).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs}
PROMPTS=${PROMPTS:-2}
PROMPTS_T1=${PROMPTS_T1:-1}
drafttree bench --setting S --temperature 0 --prompts "$PROMPTS" --max-new-tokens 256 --threads 2 --warmup 1 \
    --methods hf-ar,ar,lookup,eagle2,switch,auto --out "$OUT/hybrid-S-t0"
drafttree bench --setting S --temperature 1 --prompts "$PROMPTS_T1" --max-new-tokens 256 --threads 2 --warmup 1 \
    --methods hf-ar,ar,lookup,auto --out "$OUT/hybrid-S-t1"
