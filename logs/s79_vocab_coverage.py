"""Stop 79, a probe: how much of what a target writes falls in its lowest token ids (a byte-level BPE vocabulary lists
its tokens in merge order, the frequent first): the coverage a draft vocabulary of the first N ids would have. The
target's greedy answers (bf16, 96 tokens) to the first turn of the held-out prompt classes (data/heldout: translation,
passage QA, arithmetic, emails, code edits, chat; never the six benchmark tasks).
Usage: python logs/s79_vocab_coverage.py MODEL [MODEL ...]"""

import json
import sys
from pathlib import Path

import torch

from drafttree.api import SpeculativeModel
from drafttree.models import load_model

torch.set_num_threads(2)
prompts = [json.loads(line)["turns"][0] for f in sorted(Path("data/heldout").glob("*.jsonl"))
           for line in f.read_text().splitlines()[:4]]
for name in sys.argv[1:]:
    t = load_model(name, dtype=torch.bfloat16, show_progress=False)
    sm = SpeculativeModel(t, method="lookup")
    toks = []
    for p in prompts:
        ids = t.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                              return_tensors="pt", return_dict=True)["input_ids"][0]
        toks += sm.generate(ids, max_new_tokens=96).tokens
    ids = torch.tensor(toks)
    vocab = t.model.get_output_embeddings().weight.shape[0]
    cover = {n: float((ids < n).float().mean()) for n in (8192, 16384, 32768, 65536) if n < vocab}
    print(f"{name}: {len(toks)} tokens of {len(prompts)} answers, vocabulary {vocab}; share in the first N ids: "
          + ", ".join(f"{n}: {c:.4f}" for n, c in cover.items()) + f"; largest id {int(ids.max())}")
