"""Probe (stop 75): what chains cost and gain on a hybrid model of a real model's shape (random weights: no such model
is on this machine). A Qwen3.5-shaped text model (3 gated-delta-net layers to 1 attention layer), bf16, 2 threads;
`ar`, `lookup` and `auto` alternated, 3 rounds, on a prompt whose continuation repeats it (the random model's greedy
text loops, so n-gram chains get accepted) and one that does not. python logs/s75_chain_speed.py [hidden] [layers]"""
import statistics
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from drafttree.api import SpeculativeModel
from drafttree.models import LoadedModel

sys.path.insert(0, "tests")
from test_chain_target import IdsTokenizer  # noqa: E402

HID = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
LAYERS = int(sys.argv[2]) if len(sys.argv) > 2 else 24
torch.set_num_threads(2)
cfg = AutoConfig.for_model("qwen3_5_text", vocab_size=32000, hidden_size=HID, intermediate_size=3 * HID,
                           num_hidden_layers=LAYERS, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                           layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (LAYERS // 4),
                           linear_num_key_heads=8, linear_num_value_heads=8, linear_key_head_dim=128,
                           linear_value_head_dim=128, max_position_embeddings=4096)
cfg.bos_token_id, cfg.eos_token_id = 0, None
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).eval().requires_grad_(False)
model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters", flush=True)
sm = SpeculativeModel(LoadedModel(model, IdsTokenizer(), f"random-qwen3_5-{HID}x{LAYERS}", ""), method="lookup")
g = torch.Generator().manual_seed(1)
base = torch.randint(2, 32000, (120,), generator=g)
prompts = {"repeats": torch.cat([base, base[:60]]), "fresh": torch.randint(2, 32000, (180,), generator=g)}
sm.generate(prompts["fresh"][:20], max_new_tokens=4, method="ar", ignore_eos=True)  # warm-up (and calibration)
for name, p in prompts.items():
    res = {m: [] for m in ("ar", "lookup", "auto")}
    taus = {}
    for _ in range(3):
        for m in res:
            t0 = time.perf_counter()
            out = sm.generate(p, max_new_tokens=64, method=m, ignore_eos=True)
            res[m].append(64 / (time.perf_counter() - t0))
            taus[m] = out.tau
            if m == "ar":
                ref = out.tokens
            assert out.tokens == ref, m
    ar = statistics.median(res["ar"])
    med = {m: statistics.median(v) for m, v in res.items()}
    print(name, "  ".join(f"{m} {med[m]:.1f} tok/s (tau {taus[m]:.2f}, {med[m] / ar:.2f}x ar)" for m in res))
