"""Stop 78: a DFlash drafter on a real Qwen target (Qwen2.5-Coder-0.5B-Instruct from the offline pack; z-lab publishes
drafters for Qwen targets): a random drafter as wide as the target (one Qwen3 layer, 14 heads of 64, 2 key-value heads,
target layers 1, 11, 21 of 24, block of 16) in z-lab's layout, then `drafttree generate --compare` in bfloat16 with
`dflash`, `eagle2` and `auto`: identical tokens to plain decoding (speed is meaningless: the drafter is untrained).
Usage: python logs/s78_dflash_qwen.py OUTDIR (after `drafttree models install qwen2.5-coder-0.5b-instruct`)"""

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

out = Path(sys.argv[1])
H, HEADS, KV, D, V, IDS, FF = 896, 14, 2, 64, 151936, [1, 11, 21], 4864
g = torch.Generator().manual_seed(0)


def rnd(*shape):
    return torch.randn(*shape, generator=g) * shape[-1] ** -0.5


p = "layers.0."
w = {"fc.weight": rnd(H, len(IDS) * H), "hidden_norm.weight": torch.ones(H), "norm.weight": torch.ones(H),
     p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
     p + "self_attn.q_proj.weight": rnd(HEADS * D, H), p + "self_attn.k_proj.weight": rnd(KV * D, H),
     p + "self_attn.v_proj.weight": rnd(KV * D, H), p + "self_attn.o_proj.weight": rnd(H, HEADS * D),
     p + "self_attn.q_norm.weight": torch.ones(D), p + "self_attn.k_norm.weight": torch.ones(D),
     p + "mlp.gate_proj.weight": rnd(FF, H), p + "mlp.up_proj.weight": rnd(FF, H),
     p + "mlp.down_proj.weight": rnd(H, FF)}
cfg = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
       "model_type": "qwen3", "block_size": 16, "dflash_config": {"mask_token_id": 151665, "target_layer_ids": IDS},
       "hidden_size": H, "intermediate_size": FF, "num_hidden_layers": 1, "num_attention_heads": HEADS,
       "num_key_value_heads": KV, "head_dim": D, "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
       "max_position_embeddings": 32768, "attention_bias": False, "num_target_layers": 24, "dtype": "bfloat16"}
d = out / "qwen2.5-coder-0.5b-dflash-b16"
d.mkdir(parents=True, exist_ok=True)
(d / "config.json").write_text(json.dumps(cfg, indent=1))
save_file({k: v.to(torch.bfloat16) for k, v in w.items()}, str(d / "model.safetensors"))
prompt = "Write a Python function that checks whether a string is a palindrome."
for method in ("dflash", "eagle2", "auto"):
    args = ["generate", prompt, "--model", "qwen2.5-coder-0.5b-instruct", "--head", str(d), "--method", method,
            "--max-new-tokens", "48", "--dtype", "bfloat16", "--compare"]
    proc = subprocess.run([sys.executable, "-m", "drafttree", *args], capture_output=True, text=True)
    print("$ drafttree", " ".join(args), f"(exit {proc.returncode})")
    print((proc.stdout + proc.stderr).strip()[-900:], "\n")
