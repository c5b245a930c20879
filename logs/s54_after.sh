# run after the T=1 bench, one at a time (nothing else timed beside them)
.venv/bin/python logs/s54_batch_split.py ar 16 > logs/s54_split_ar16.log 2>&1
.venv/bin/python logs/s54_batch_split.py auto 16 > logs/s54_split_auto16.log 2>&1
.venv/bin/drafttree bench concurrency --users 1,4,16,64 --methods auto,ar --max-new-tokens 128 --dtype bfloat16 --threads 2 --repeats 3 --alone --out runs/concurrency-s54 > logs/s54_conc.log 2>&1
echo done > logs/s54_after.done
