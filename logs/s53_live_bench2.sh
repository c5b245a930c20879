# stop 53: eagle2 with and without the live curve; one user through the batch decoder (the server's path)
set -x
.venv/bin/drafttree bench --setting S --prompts 5 --max-new-tokens 128 --threads 2 --warmup 1 --dtype bfloat16 --temperature 0 --methods ar,eagle2,eagle2:live_curve=false --out runs/s53-S-t0-eagle2-live
.venv/bin/drafttree bench concurrency --users 1 --methods auto,auto:live_curve=false,ar --max-new-tokens 128 --dtype bfloat16 --threads 2 --repeats 5 --out runs/concurrency-s53-1-live
