#!/usr/bin/env bash
# The benchmark runs behind docs/benchmarks.md, then the document itself. Each run resumes when re-run.
# Sizes are what fit one session on the 2-core development machine; raise PROMPTS / MAX_NEW on a bigger one
# (the full sets: PROMPTS=80, MAX_NEW=256).
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPTS=${PROMPTS:-5}
PROMPTS_T1=${PROMPTS_T1:-5}
PROMPTS_L=${PROMPTS_L:-3}
MAX_NEW=${MAX_NEW:-256}
MAX_NEW_L=${MAX_NEW_L:-128}
OUT=${OUT:-runs}

# S, T=0: plain decoding, peers, EAGLE chain/static/dynamic and every AdaEAGLE policy, side by side
drafttree bench --setting S --temperature 0 --prompts "$PROMPTS" --max-new-tokens "$MAX_NEW" --threads 2 \
  --methods hf-ar,ar,lookup,hf-lookup,eagle-chain:k=3,eagle-chain,eagle-chain:k=6,eagle1,eagle2 \
  --methods eagle-chain-threshold,eagle-chain-ldlp,eagle-chain-ldlp-threshold,eagle-chain-oracle,eagle2-ldlp \
  --out "$OUT/bench-S-t0"

# S, T=1: sampling (MT-bench)
drafttree bench --setting S --temperature 1 --tasks mt_bench --prompts "$PROMPTS_T1" --max-new-tokens "$MAX_NEW" \
  --threads 2 --methods hf-ar,ar,lookup,eagle-chain,eagle1,eagle2,eagle2-ldlp --out "$OUT/bench-S-t1"

# L: Qwen2.5-Coder-1.5B target, 0.5B classic draft (offline packs: drafttree models install ...)
drafttree bench --setting L --prompts "$PROMPTS_L" --max-new-tokens "$MAX_NEW_L" --threads 2 \
  --methods hf-ar,ar,hf-assisted,draft,lookup,hf-lookup --out "$OUT/bench-L"

drafttree bench report "$OUT/bench-S-t0" "$OUT/bench-S-t1" "$OUT/bench-L" --out docs/benchmarks.md
