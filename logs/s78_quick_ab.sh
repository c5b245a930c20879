#!/bin/bash
# drafttree bench --quick alternated: stop 77's code (/tmp/wt77, 1cc88c0) and this stop's, three pairs (third reversed)
cd /work/main
q() { PYTHONPATH=$1/src .venv/bin/python -m drafttree bench --quick --dtype bfloat16 --threads 2 --out runs/s78-quick-$2 > /dev/null 2>&1; }
q /tmp/wt77 before1; q /work/main after1
q /tmp/wt77 before2; q /work/main after2
q /work/main after3; q /tmp/wt77 before3
