"""Stop 78: the CLI end to end with a DFlash drafter. Writes a random DFlash drafter as wide as SmolLM2 (a Qwen3 layer,
9 heads of 64, 3 key-value heads; target layers 1, 14, 26; block of 16) in z-lab's published layout, with the remote
code's config fields, and runs `drafttree generate` with it (--compare: the same text as plain decoding) for the methods
that take a head, then the misuses. Speed here is meaningless: the drafter is untrained, its drafts are rejected.
Usage: python logs/s78_dflash_cli.py OUTDIR"""

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

out = Path(sys.argv[1])
H, HEADS, KV, D, V, IDS = 576, 9, 3, 64, 49152, [1, 14, 26]
g = torch.Generator().manual_seed(0)


def rnd(*shape):
    return torch.randn(*shape, generator=g) * shape[-1] ** -0.5


w = {"fc.weight": rnd(H, len(IDS) * H), "hidden_norm.weight": torch.ones(H), "norm.weight": torch.ones(H)}
p = "layers.0."
w |= {p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
      p + "self_attn.q_proj.weight": rnd(HEADS * D, H), p + "self_attn.k_proj.weight": rnd(KV * D, H),
      p + "self_attn.v_proj.weight": rnd(KV * D, H), p + "self_attn.o_proj.weight": rnd(H, HEADS * D),
      p + "self_attn.q_norm.weight": torch.ones(D), p + "self_attn.k_norm.weight": torch.ones(D),
      p + "mlp.gate_proj.weight": rnd(1536, H), p + "mlp.up_proj.weight": rnd(1536, H),
      p + "mlp.down_proj.weight": rnd(H, 1536)}
cfg = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
       "model_type": "qwen3", "block_size": 16, "dflash_config": {"mask_token_id": 0, "target_layer_ids": IDS},
       "hidden_size": H, "intermediate_size": 1536, "num_hidden_layers": 1, "num_attention_heads": HEADS,
       "num_key_value_heads": KV, "head_dim": D, "vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
       "max_position_embeddings": 8192, "attention_bias": False, "num_target_layers": 30, "dtype": "bfloat16"}
d = out / "smollm2-dflash-b16"
d.mkdir(parents=True, exist_ok=True)
(d / "config.json").write_text(json.dumps(cfg, indent=1))
save_file({k: v.to(torch.bfloat16) for k, v in w.items()}, str(d / "model.safetensors"))
dt = [sys.executable, "-m", "drafttree"]
prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog."
runs = [["generate", prompt, "--head", str(d), "--method", m, "--max-new-tokens", "32", "--dtype", "float32",
         "--compare"] for m in ("dflash", "eagle2", "auto")]
runs += [["generate", prompt, "--method", "dflash", "--max-new-tokens", "8"],  # the shipped EAGLE head: refused
         ["generate", prompt, "--head", "z-lab/not-downloaded-DFlash", "--max-new-tokens", "8"],
         ["export-head", str(d), str(out / "exported"), "--format", "vllm"]]
for args in runs:
    proc = subprocess.run(dt + args, capture_output=True, text=True)
    print("$ drafttree", " ".join(args), f"(exit {proc.returncode})")
    print((proc.stdout + proc.stderr).strip()[-1500:], "\n")
