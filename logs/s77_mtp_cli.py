"""Stop 77: the CLI end to end with a checkpoint's own MTP layer. Builds a tiny random DeepSeek-V3 (SmolLM2's tokenizer,
so that text goes in and out; 2 layers + the MTP layer at index 2, stored in two shards) and runs `drafttree generate`
with --head mtp, with the default (the MTP layer found in the model's directory), --compare, and export-head's refusal.
Usage: python logs/s77_mtp_cli.py OUTDIR"""

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

from drafttree.models import load_model

out = Path(sys.argv[1])
tok = load_model("smollm2-135m-instruct", show_progress=False).tokenizer
V, H, L = len(tok), 64, 2
values = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_attention_heads=4, num_key_value_heads=4,
              max_position_embeddings=2048, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
              v_head_dim=16, head_dim=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
torch.manual_seed(0)
full = AutoModelForCausalLM.from_config(AutoConfig.for_model("deepseek_v3", **values, num_hidden_layers=L + 1))
state = full.state_dict()
g = torch.Generator().manual_seed(3)
for k in ("enorm", "hnorm", "shared_head.norm"):
    state[f"model.layers.{L}.{k}.weight"] = 1.0 + 0.1 * torch.randn(H, generator=g)
state[f"model.layers.{L}.eh_proj.weight"] = torch.randn(H, 2 * H, generator=g) / H ** 0.5
state[f"model.layers.{L}.shared_head.head.weight"] = state["lm_head.weight"].clone()
state[f"model.layers.{L}.embed_tokens.weight"] = state["model.embed_tokens.weight"].clone()
cfg = AutoConfig.for_model("deepseek_v3", **values, num_hidden_layers=L, num_nextn_predict_layers=1)
out.mkdir(parents=True, exist_ok=True)
cfg.save_pretrained(out)
tok.save_pretrained(out)
names, files = sorted(state), {}
for i in range(2):
    part = {k: state[k].contiguous() for k in names[i::2]}
    save_file(part, str(out / f"model-0000{i + 1}-of-00002.safetensors"), metadata={"format": "pt"})
    files |= dict.fromkeys(part, f"model-0000{i + 1}-of-00002.safetensors")
(out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": files}))
dt = [sys.executable, "-m", "drafttree"]
runs = [["generate", "Tell me a story.", "--model", str(out), "--head", "mtp", "--method", "eagle2",
         "--max-new-tokens", "24", "--dtype", "float32", "--compare"],
        ["generate", "Tell me a story.", "--model", str(out), "--method", "eagle-chain", "--max-new-tokens", "24",
         "--dtype", "float32", "--compare"],
        ["generate", "Tell me a story.", "--model", str(out), "--head", "mtp", "--method", "lookup",
         "--max-new-tokens", "8"],
        ["generate", "Tell me a story.", "--model", "smollm2-135m-instruct", "--head", "mtp", "--max-new-tokens", "8"],
        ["export-head", str(out), str(out.parent / "exported"), "--format", "vllm"]]
for args in runs:
    p = subprocess.run(dt + args, capture_output=True, text=True)
    print("$ drafttree", " ".join(args), f"(exit {p.returncode})")
    print((p.stdout + p.stderr).strip()[-1500:], "\n")
