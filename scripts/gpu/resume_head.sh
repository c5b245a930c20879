#!/bin/bash
# A second call on the same held machine: resume continue_head.sh's training for MAX_S seconds (its flags unchanged).
set -u
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/w}; DEV=${DEV:-cuda}; MAX_S=${MAX_S:-140}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DRAFTTREE_CACHE=${DRAFTTREE_CACHE:-/tmp/dtcache}
export PYTHONPATH=$PWD/src:/tmp/site
python3 -m drafttree train --features $W/feat --extra-features $W/feat-t --out $W/run --head-kind eagle1 --dtype bfloat16 \
  --device $DEV --epochs 60 --ttt-steps 3 --draft-vocab 8192 --batch-tokens 16384 --eval-samples 96 --eval-after 3874 \
  --init-head src/drafttree/assets/heads/smollm2-135m-instruct --lr 3e-4 --warmup-steps 20 --eval-every 200 \
  --save-every 100 --max-seconds $MAX_S --resume 2>&1 | tr '\r' '\n' | grep -v "^$" | awk '/eval|epoch|Error|error|Traceback|^ |^\{|^\}/ || NR%40==1'
cp $W/run/summary.json $OUT/summary2.json 2>/dev/null; cp $W/run/checkpoint/progress.json $OUT/progress2.json 2>/dev/null
tar -cf $OUT/head2.tar --exclude="ldlp-labels*" -C $W/run head; ls -la $OUT
