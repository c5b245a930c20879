# stop 53: auto next to auto:live_curve=true, side by side in each run
set -x
.venv/bin/drafttree bench --setting S --prompts 5 --max-new-tokens 128 --threads 2 --warmup 1 --dtype bfloat16 --temperature 0 --methods ar,auto,auto:live_curve=true --out runs/s53-S-t0-live
.venv/bin/drafttree bench --setting S --prompts 5 --max-new-tokens 128 --threads 2 --warmup 1 --dtype bfloat16 --temperature 1 --methods ar,auto,auto:live_curve=true --out runs/s53-S-t1-live
.venv/bin/drafttree bench --tasks data/heldout/translate.jsonl,data/heldout/rag_qa.jsonl,data/heldout/math_steps.jsonl,data/heldout/email.jsonl,data/heldout/code_edit.jsonl --prompts 4 --max-new-tokens 128 --threads 2 --warmup 1 --dtype bfloat16 --temperature 0 --methods ar,auto,auto:live_curve=true --out runs/s53-heldout-live
.venv/bin/drafttree bench --setting L --temperature 0 --prompts 5 --max-new-tokens 128 --threads 2 --warmup 1 --dtype bfloat16 --methods ar,auto,auto:live_curve=true --out runs/s53-L-live
