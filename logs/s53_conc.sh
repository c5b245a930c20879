.venv/bin/drafttree bench concurrency --users 1,4,16 --methods auto,ar --max-new-tokens 128 --dtype bfloat16 --threads 2 --repeats 3 --alone --out runs/concurrency-s53
