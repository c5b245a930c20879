#!/bin/bash
# alternated demo A/B: the code before (BEFORE, default /tmp/wt78 = stop 78, 4e4c492) against this stop's (/work/main), same venv
cd /work/main
PROMPT=$(grep "^PROMPT" Makefile | sed 's/^PROMPT *?*= *//')
for i in $(seq 1 $1); do
  for d in ${BEFORE:-/tmp/wt78} /work/main; do
    out=$(PYTHONPATH=$d/src .venv/bin/python -m drafttree generate "$PROMPT" --compare --warmup --max-new-tokens 256 2>&1 | grep speedup)
    echo "$d: $out"
  done
done
