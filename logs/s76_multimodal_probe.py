"""Model types whose hub checkpoints are multimodal wrappers (Gemma 3 / 4, Qwen3.5: `AutoModelForCausalLM` gives a
`...ForConditionalGeneration`), and Gemma 4's text model with its own features (per-layer inputs, shared KV layers),
built tiny, through stop 74's matrix checks (stop 76, a probe):
python logs/s76_multimodal_probe.py [dtype] [type ...]"""
import os
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
DTYPE = sys.argv[1] if len(sys.argv) > 1 else "float32"
ONLY = sys.argv[2:]
sys.argv = sys.argv[:2]
import s74_arch_matrix as matrix  # noqa: E402

V, H = matrix.V, matrix.H
TEXT = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
GEMMA4_TEXT = TEXT | dict(sliding_window=8, vocab_size_per_layer_input=V, hidden_size_per_layer_input=8,
                          num_global_key_value_heads=2, global_head_dim=16, num_kv_shared_layers=2,
                          layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
QWEN35_TEXT = TEXT | dict(layer_types=["linear_attention", "full_attention"] * 2, linear_num_value_heads=4,
                          linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)
CONFIGS = {
    "gemma3": dict(text_config=TEXT | dict(sliding_window=8), vision_config=VISION | dict(image_size=28, patch_size=14),
                   mm_tokens_per_image=4),
    "gemma4_text": GEMMA4_TEXT,
    "gemma4_text-noshare": GEMMA4_TEXT | dict(num_kv_shared_layers=0),
    "gemma4": dict(text_config=GEMMA4_TEXT, vision_config=VISION, audio_config=None),
    "gemma4_unified": dict(text_config=GEMMA4_TEXT, vision_config=VISION, audio_config=None),
    "gemma3n_text": TEXT | dict(num_hidden_layers=6, sliding_window=8, vocab_size_per_layer_input=V,
                                hidden_size_per_layer_input=8, laurel_rank=8, altup_num_inputs=2,
                                num_kv_shared_layers=2, activation_sparsity_pattern=[0.0] * 6,
                                layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2),
    "qwen3_5": dict(text_config=QWEN35_TEXT, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64,
                                                                 num_heads=2, out_hidden_size=H)),
}


def build(arch: str, dtype: torch.dtype):
    cfg = AutoConfig.for_model(arch.split("-")[0], **CONFIGS[arch])
    for c in (cfg, cfg.get_text_config()):
        c.bos_token_id, c.eos_token_id = 0, None
        c.pad_token_id = 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    print(f"# {arch}: {type(model).__name__}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M", flush=True)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    model.requires_grad_(False)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


if __name__ == "__main__":
    matrix.build = build
    matrix.main_for(ONLY or list(CONFIGS), getattr(torch, DTYPE))
