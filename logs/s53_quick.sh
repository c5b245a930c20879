# stop 53: --quick before (a worktree of ba45765: head I, no live curve) and after (HEAD)
set -x
PYTHONPATH=/tmp/wt-before/src .venv/bin/python -m drafttree bench --quick --dtype bfloat16 --threads 2 --out runs/s53-quick-before
.venv/bin/python -m drafttree bench --quick --dtype bfloat16 --threads 2 --out runs/s53-quick-after
