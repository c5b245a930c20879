#!/bin/bash
# A second call on the same held machine: resume continue_head.sh's training for MAX_S seconds (its flags unchanged).
set -u
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/w}; DEV=${DEV:-cuda}; MAX_S=${MAX_S:-140}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DRAFTTREE_CACHE=${DRAFTTREE_CACHE:-/tmp/dtcache}
export PYTHONPATH=$PWD/src:/tmp/site
DT="python3 -m drafttree" BT=16384 EVAL="--eval-samples 96 --eval-after 3874"
source scripts/gpu/train_head.sh
train_head --max-seconds $MAX_S --resume
cp $W/run/summary.json $OUT/summary2.json 2>/dev/null; cp $W/run/checkpoint/progress.json $OUT/progress2.json 2>/dev/null
tar -cf $OUT/head2.tar --exclude="ldlp-labels*" -C $W/run head; ls -la $OUT
