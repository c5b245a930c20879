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
INIT_HEAD=${INIT_HEAD:-}    # continue this head (e.g. the shipped one) instead of starting from scratch
EVAL_AFTER=${EVAL_AFTER:-0} # hold out only answers from this index on (3874: those the first head never saw)
LR=${LR:-6e-4}
MAX_STEPS=${MAX_STEPS:-0}
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
    --ttt-steps "$TTT" --draft-vocab 8192 --lr "$LR" --batch-tokens 8192 --eval-every 100 --resume \
    --eval-after "$EVAL_AFTER" --max-steps "$MAX_STEPS" ${INIT_HEAD:+--init-head "$INIT_HEAD"}

# 5. AdaEAGLE's draft length predictor, next to the head (EAGLE-1/2 heads only)
[ "$HEAD_KIND" = eagle3 ] || drafttree train-length --features "$DATA/features" --head "$RUN/head" --out "$RUN/head" --k-max 8 --lam 3 --dtype "$DTYPE" --max-samples 600 --eval-after "$EVAL_AFTER"

# 6. the hybrid drafter's files next to the head: the corpus of the target's answers (with its own greedy fit) and
#    calibration priors fitted for this head, greedy and sampled, on training prompts
SHIP=src/drafttree/assets/heads/smollm2-135m-instruct
[ -f "$RUN/head/corpus.npz" ] || drafttree data corpus --distilled "$DATA/distill.jsonl" --out "$RUN/head/corpus.npz" \
    --priors "$RUN/head/hybrid-priors.json"
for T in 0 1; do
    python scripts/fit_hybrid_priors.py --prompts "$DATA/prompts.jsonl" --n 32 --max-new-tokens 96 --temperature "$T" \
        --distilled "$DATA/distill.jsonl" --out "$RUN/head" --keep-corpus-fit
done

# 7. ship it
mkdir -p src/drafttree/assets/heads
rm -rf "$SHIP"
cp -r "$RUN/head" "$SHIP"
rm -f "$SHIP"/ldlp-labels-*.safetensors
echo "shipped head: $SHIP"
