#!/bin/bash
# drafttree bench --quick alternated: stop 78's code (/tmp/wt78, 4e4c492) and this stop's, three pairs (third reversed)
cd /work/main
q() { PYTHONPATH=$1/src .venv/bin/python -m drafttree bench --quick --dtype bfloat16 --threads 2 --out runs/s79-quick-$2 > /dev/null 2>&1; }
q /tmp/wt78 before1; q /work/main after1
q /tmp/wt78 before2; q /work/main after2
q /work/main after3; q /tmp/wt78 before3
