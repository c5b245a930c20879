"""Diagnostic: where 16 chatting users' time goes (bench concurrency --turns), cProfile of one run per method.
Usage: python logs/s61_conv_profile.py METHOD USERS TURNS MAX_NEW"""
import cProfile
import pstats
import sys

import torch

import drafttree
from drafttree.bench.concurrency import interleaved_conversations, run_conversations

method, users, turns, max_new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(2)
sm = drafttree.SpeculativeModel.from_pretrained(dtype="bfloat16")
convs = interleaved_conversations(["data/heldout/chat_turns.jsonl"], users, turns)
cached: dict = {}
run_conversations(sm, [c[:2] for c in convs[:2]], method, 8, 2, cached)  # warm-up
prof = cProfile.Profile()
prof.enable()
r = run_conversations(sm, convs, method, max_new, users, cached)
prof.disable()
print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k not in ("tokens", "finish")},
      "tok/s", round(sum(r["tokens"]) / r["wall"], 1))
pstats.Stats(prof).sort_stats(sys.argv[5] if len(sys.argv) > 5 else "cumulative").print_stats(35)
