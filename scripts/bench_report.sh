#!/usr/bin/env bash
# docs/benchmarks.md from the runs that exist: the issue-size runs of scripts/bench_full.sh first, then the
# wider method sweeps of scripts/bench_all.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs}
runs=()
for d in hybrid-S-t0 hybrid-S-t1 full-S-t0 full-S-t1 full-L bench-S-t0-eagle2 bench-S-t0 bench-S-t1 bench-L; do
  if [ -f "$OUT/$d/run.json" ]; then runs+=("$OUT/$d"); fi
done
if [ ${#runs[@]} -eq 0 ]; then echo "no benchmark runs under $OUT/" >&2; exit 1; fi
drafttree bench report "${runs[@]}" --out "${REPORT:-docs/benchmarks.md}"
