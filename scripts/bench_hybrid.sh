#!/usr/bin/env bash
# Issue 10's runs (the hybrid sections at the top of docs/benchmarks.md): S at T=0 with every method the issue names,
# S at T=1, and L (HumanEval, Qwen2.5-Coder 1.5B with the 0.5B as draft
# LM: `auto` there is lookup + draft LM in one tree; needs `drafttree models install` of both packs). Resumable and
# round-robin over tasks: a stopped run holds every task evenly; re-running the same command adds prompts up to
# PROMPTS / PROMPTS_T1 / PROMPTS_L. DTYPE (default bfloat16, as the issue asks; float32 on a CPU without AVX-512 BF16,
# where bf16 products are slower) applies to the S runs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs}
PROMPTS=${PROMPTS:-20}
PROMPTS_T1=${PROMPTS_T1:-10}
PROMPTS_L=${PROMPTS_L:-20}
RUNS=${RUNS:-t0 t1}
DTYPE=${DTYPE:-bfloat16}
for r in $RUNS; do
  case "$r" in
    t0) drafttree bench --setting S --temperature 0 --prompts "$PROMPTS" --max-new-tokens 256 --threads 2 --warmup 1 \
          --dtype "$DTYPE" --methods hf-ar,ar,lookup,hf-lookup,eagle2,hybrid,auto --out "$OUT/issue10-S-t0-$DTYPE" ;;
    t1) drafttree bench --setting S --temperature 1 --prompts "$PROMPTS_T1" --max-new-tokens 256 --threads 2 --warmup 1 \
          --dtype "$DTYPE" --methods hf-ar,ar,lookup,auto --out "$OUT/issue10-S-t1-$DTYPE" ;;
    l) drafttree bench --setting L --temperature 0 --prompts "$PROMPTS_L" --max-new-tokens 256 --threads 2 --warmup 1 \
          --methods hf-ar,ar,hf-assisted,lookup,draft,auto --out "$OUT/issue10-L" ;;
    *) echo "RUNS takes t0, t1 and/or l" >&2; exit 2 ;;
  esac
done
