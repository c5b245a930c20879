#!/bin/bash
# One benchmark command alternated between the code before (BEFORE, a worktree) and this checkout, PAIRS pairs (the
# last pair reversed), then each run's mean speedups of METHOD (default auto) vs hf-ar and vs our ar, read from its
# table.md. Usage: BEFORE=/tmp/wt80 PAIRS=3 bash logs/s80_bench_ab.sh NAME BENCH-ARGS...   (runs/NAME-{before,after}N)
# e.g. BEFORE=/tmp/wt80 bash logs/s80_bench_ab.sh s80-quick --quick --dtype bfloat16 --threads 2
# SUMMARY_ONLY=1: read the runs already there. Without hf-ar in the methods, "our ar" is the runs' own baseline table.
cd /work/main
name=$1; shift
pairs=${PAIRS:-3}
run() { PYTHONPATH=$1/src .venv/bin/python -m drafttree bench "${@:3}" --out runs/$name-$2 > /dev/null 2>&1; }
for i in $(seq 1 $pairs); do
  [ -n "$SUMMARY_ONLY" ] && break
  if [ "$i" -lt "$pairs" ]; then order="before after"; else order="after before"; fi
  for side in $order; do
    if [ $side = before ]; then dir=${BEFORE:?set BEFORE to a worktree of the code before}; else dir=/work/main; fi
    run $dir $side$i "$@"
  done
done
for side in before after; do
  for i in $(seq 1 $pairs); do
    t=runs/$name-$side$i/table.md
    m=${METHOD:-auto}
    hf=$(awk -F'|' -v m=" $m " '/Speedup vs `hf-ar`/{s=1} s && $2==m{print $(NF-1); exit}' $t)
    ar=$(awk -F'|' -v m=" $m " '/Speedup vs (our )?`ar`/{s=1} s && $2==m{print $(NF-1); exit}' $t)
    echo "$name-$side$i: ${METHOD:-auto} $hf hf-ar, $ar our ar"
  done
done
