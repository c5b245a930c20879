"""Stop 79: the CLI end to end with ERNIE 4.5's and Mellum's own MTP layers. Builds a tiny random ERNIE 4.5 MoE (MoE
from layer 1; its MTP layer dense, `model.mtp_{emb_norm,hidden_norm,linear_proj}.0` and `model.mtp_block.0.`, the final
norm shared) and a tiny random Mellum (its MTP layer `mtp.*`: sliding-window attention with MoE, a window of 16 tokens,
shorter than the prompt), both with SmolLM2's tokenizer, and runs `drafttree generate --head mtp --compare` with eagle2
and auto in float32 and bfloat16; then --draft-vocab (the MTP layer drafting over the first 8,192 ids) and its misuse.
Usage: python logs/s79_mtp_cli.py OUTDIR"""

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
BASE = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=2048, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id or 0)
KINDS = {
    "ernie4_5_moe": dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=1,
                         moe_layer_start_index=1),
    "mellum": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, sliding_window=16),
}


def build(arch: str) -> Path:
    """An L-layer model whose checkpoint also holds its MTP layer in the model's published names."""
    values = BASE | KINDS[arch]
    types = {}
    if arch == "mellum":
        types = dict(layer_types=["sliding_attention", "full_attention"], mlp_layer_types=["sparse"] * L,
                     mtp_layer_types=["sliding_attention"], mtp_mlp_layer_types=["sparse"])
    torch.manual_seed(0)
    full_types = {} if arch != "mellum" else dict(layer_types=types["layer_types"] + ["sliding_attention"],
                                                   mlp_layer_types=["sparse"] * (L + 1))
    full = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **values, **full_types,
                                                                 num_hidden_layers=L + 1))
    full.save_pretrained(out / f"{arch}-full")  # the published tensor names (one tensor per expert)
    from safetensors import safe_open
    with safe_open(str(out / f"{arch}-full" / "model.safetensors"), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    g = torch.Generator().manual_seed(3)
    norm = [1.0 + 0.1 * torch.randn(H, generator=g) for _ in range(3)]
    fc = torch.randn(H, 2 * H, generator=g) / H ** 0.5
    if arch == "ernie4_5_moe":  # dense: layer 0's kind of layer (its weights copied), the final norm shared
        block = {k.replace("model.layers.0.", "model.mtp_block.0."): v.clone() for k, v in state.items()
                 if k.startswith("model.layers.0.")}
        mtp = {"model.mtp_emb_norm.0.weight": norm[0], "model.mtp_hidden_norm.0.weight": norm[1],
               "model.mtp_linear_proj.0.weight": fc} | block
    else:
        block = {k.replace(f"model.layers.{L}.", "mtp.layers.0."): v for k, v in state.items()
                 if k.startswith(f"model.layers.{L}.")}
        mtp = {"mtp.pre_fc_norm_embedding.weight": norm[0], "mtp.pre_fc_norm_hidden.weight": norm[1],
               "mtp.norm.weight": norm[2], "mtp.fc.weight": fc} | block
    state = {k: v for k, v in state.items() if not k.startswith(f"model.layers.{L}.")} | mtp
    path = out / arch
    cfg = AutoConfig.for_model(arch, **values, **types, num_hidden_layers=L, num_mtp_layers=1)
    path.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(path)
    tok.save_pretrained(path)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


prompt = ("Summarise: the river rose through the night, the bridge closed at dawn, and by noon the town hall had "
          "opened its doors to families from the lower streets, who brought blankets, dogs and stories.")
dt = [sys.executable, "-m", "drafttree"]


def run(args: list[str]) -> None:
    p = subprocess.run(dt + args, capture_output=True, text=True)
    print("$ drafttree", " ".join(a if " " not in a else "'...'" for a in args), f"(exit {p.returncode})")
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith(("[", "speedup")) or "error" in ln]
    print("\n".join(lines) + "\n")


for arch in KINDS:
    path = build(arch)
    for method, dtype in (("eagle2", "float32"), ("auto", "float32"), ("eagle-chain", "bfloat16")):
        run(["generate", prompt, "--model", str(path), "--head", "mtp", "--method", method, "--max-new-tokens", "40",
             "--dtype", dtype, "--compare"])
    run(["generate", prompt, "--model", str(path), "--head", "mtp", "--method", "eagle2", "--max-new-tokens", "40",
         "--dtype", "float32", "--draft-vocab", "8192", "--compare"])
run(["generate", prompt, "--max-new-tokens", "8", "--draft-vocab", "8192"])  # the shipped head has its own
run(["generate", prompt, "--model", str(out / "mellum"), "--method", "lookup", "--draft-vocab", "8192"])
run(["generate", prompt, "--max-new-tokens", "8", "--draft-vocab", "0"])
