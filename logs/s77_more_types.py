"""Model types no earlier probe judged (stop 74's sweep could not build them at its default sizes), each with sizes of
its own, through stop 74's matrix checks (stop 77, a probe): python logs/s77_more_types.py [dtype] [type ...]"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
DTYPE = sys.argv[1] if len(sys.argv) > 1 else "float32"
ONLY = sys.argv[2:]
sys.argv = sys.argv[:2]
import s74_arch_matrix as matrix  # noqa: E402

V, H, L = matrix.V, matrix.H, matrix.L
BASE = matrix.LLAMA_LIKE | dict(head_dim=16)
QMOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
HYBRID = dict(layer_types=["linear_attention", "full_attention", "linear_attention"], linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
TYPES = {
    # the multimodal checkpoints' causal-LM classes (their text models)
    "qwen3_5_moe": dict(text_config=BASE | QMOE | HYBRID,
                        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                           out_hidden_size=H, patch_size=14)),
    "llama4": dict(text_config=BASE | dict(num_local_experts=2, intermediate_size_mlp=128),
                   vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      vision_output_dim=32, projector_input_dim=32, projector_output_dim=32,
                                      image_size=28, patch_size=14)),
    # Mamba layers with a transformer block shared by every other layer
    "zamba": BASE | dict(num_hidden_layers=6, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8,
                         mamba_expand=2, mamba_dt_rank=8, n_mamba_heads=1),
}

if __name__ == "__main__":
    matrix.ARCHS.update(TYPES)
    matrix.main_for(ONLY or list(TYPES), getattr(torch, DTYPE))
