#!/usr/bin/env bash
# The benchmark runs behind docs/benchmarks.md, then the document itself. Each run resumes when re-run.
# These are the wide method sweeps at small sizes (3 prompts per task, 128 tokens: every method, one session on the
# 2-core development machine); the issue-size runs with the headline methods are scripts/bench_full.sh.
# Raise PROMPTS / MAX_NEW on a bigger machine (full sets: 80 per task).
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPTS=${PROMPTS:-3}
PROMPTS_T1=${PROMPTS_T1:-3}
PROMPTS_L=${PROMPTS_L:-2}
MAX_NEW=${MAX_NEW:-128}
MAX_NEW_L=${MAX_NEW_L:-128}
OUT=${OUT:-runs}

# S, T=0: plain decoding, peers, EAGLE chain/static/dynamic and every AdaEAGLE policy, side by side
drafttree bench --setting S --temperature 0 --prompts "$PROMPTS" --max-new-tokens "$MAX_NEW" --threads 2 --warmup 1 \
  --methods hf-ar,ar,lookup,hf-lookup,eagle-chain:k=2,eagle-chain:k=3,eagle-chain,eagle1,eagle2 \
  --methods eagle-chain-threshold,eagle-chain-ldlp,eagle-chain-ldlp-threshold,eagle-chain-oracle,eagle2-ldlp \
  --out "$OUT/bench-S-t0"

# S, T=1: sampling (MT-bench)
drafttree bench --setting S --temperature 1 --tasks mt_bench --prompts "$PROMPTS_T1" --max-new-tokens "$MAX_NEW" \
  --threads 2 --warmup 1 --methods hf-ar,ar,lookup,eagle-chain,eagle1,eagle2,eagle2-ldlp --out "$OUT/bench-S-t1"

# L: Qwen2.5-Coder-1.5B target, 0.5B classic draft (offline packs: drafttree models install ...)
drafttree bench --setting L --prompts "$PROMPTS_L" --max-new-tokens "$MAX_NEW_L" --threads 2 --warmup 1 \
  --methods hf-ar,ar,hf-assisted,draft,lookup,hf-lookup --out "$OUT/bench-L"

# EAGLE-2 side by side with its baselines in one run (after the calibration fix)
drafttree bench --setting S --temperature 0 --prompts "$PROMPTS" --max-new-tokens "$MAX_NEW" --threads 2 --warmup 1 \
  --methods hf-ar,ar,eagle1,eagle2,eagle2-ldlp --out "$OUT/bench-S-t0-eagle2"

OUT="$OUT" bash scripts/bench_report.sh  # docs/benchmarks.md

# drafttree generate --compare for prompt lookup (S) and the Qwen draft pair (L), bf16
P="Rewrite this function with type hints and a docstring: def area(w, h): return w * h"
{ drafttree generate "$P" --method lookup --compare --warmup --max-new-tokens "$MAX_NEW" --json
  drafttree generate "$P" --model qwen2.5-coder-1.5b-instruct --draft-model qwen2.5-coder-0.5b-instruct \
    --method draft --compare --warmup --max-new-tokens "$MAX_NEW_L" --json; } > "$OUT/generate-compare.jsonl"
