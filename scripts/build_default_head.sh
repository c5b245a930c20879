#!/usr/bin/env bash
# Rebuild the EAGLE head (and AdaEAGLE length predictor) shipped for SmolLM2-135M-Instruct.
# Every step is resumable: re-run the script after a crash or kill and it continues.
# Times are for the 2-core AMD Zen 5 development machine (bf16); see docs/training.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-data}
RUN=${RUN:-runs/head-smollm2}
N_PROMPTS=${N_PROMPTS:-7000}
LIMIT=${LIMIT:-3874}        # distil the first N prompts of the (shuffled) order; the shipped head used 3874
EPOCHS=${EPOCHS:-3}         # the shipped head: 3 (accuracy was still rising; 8 is better if you have the time)
HEAD_KIND=${HEAD_KIND:-eagle1}  # eagle1 (the shipped head) or eagle3 (fused layers, CE only, 7 unrolled steps)
DTYPE=${DTYPE:-bfloat16}        # float32 on CPUs without AVX-512 BF16 (emulated bf16 is slower there)
TTT=${TTT:-$([ "$HEAD_KIND" = eagle3 ] && echo 7 || echo 3)}
mkdir -p "$DATA" "$RUN"

# 1. training prompts from offline packages (never the benchmark sets; BIG-bench excluded)
[ -f "$DATA/prompts.jsonl" ] || drafttree data prompts --out "$DATA/prompts.jsonl" --n "$N_PROMPTS" --seed 0

# 2. the target answers them (greedy, bf16, 256 new tokens; shuffled length-sorted batches)
[ -f "$DATA/distill.jsonl" ] || [ ! -f "$DATA/distill.jsonl.xz" ] || xz -dk "$DATA/distill.jsonl.xz"  # a committed partial run
drafttree data distill --prompts "$DATA/prompts.jsonl" --out "$DATA/distill.jsonl" --dtype "$DTYPE" \
    --batch-size 48 --max-new-tokens 256 ${LIMIT:+--limit "$LIMIT"}

# 3. target features (last hidden state after the final norm, and the inputs of layers 2, L/2, L-3 for EAGLE-3)
drafttree data features --distilled "$DATA/distill.jsonl" --out "$DATA/features" --dtype "$DTYPE" --aux-layers auto

# 4. the head: one decoder layer, 8192-token draft vocabulary, 3 (EAGLE-1) or 7 (EAGLE-3) unrolled draft steps
drafttree train --features "$DATA/features" --out "$RUN" --dtype "$DTYPE" --epochs "$EPOCHS" --head-kind "$HEAD_KIND" \
    --ttt-steps "$TTT" --draft-vocab 8192 --lr 6e-4 --batch-tokens 8192 --eval-every 100 --resume

# 5. AdaEAGLE's draft length predictor, next to the head (EAGLE-1/2 heads only)
[ "$HEAD_KIND" = eagle3 ] || drafttree train-length --features "$DATA/features" --head "$RUN/head" --out "$RUN/head" --k-max 8 --lam 3 --dtype "$DTYPE" --max-samples 600

# 6. ship it
mkdir -p src/drafttree/assets/heads
rm -rf src/drafttree/assets/heads/smollm2-135m-instruct
cp -r "$RUN/head" src/drafttree/assets/heads/smollm2-135m-instruct
rm -f src/drafttree/assets/heads/smollm2-135m-instruct/ldlp-labels-*.safetensors
echo "shipped head: src/drafttree/assets/heads/smollm2-135m-instruct"
