"""Model types stop 74's sweep could not build at its default sizes (too big, or their config validation rejects the
Llama-like sizes), each with sizes of its own, through stop 74's matrix checks (stop 76, a probe):
python logs/s76_more_types.py [dtype] [type ...]"""
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
MOE = dict(moe_intermediate_size=32, num_experts_per_tok=2)
MLA = dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
           v_head_dim=16, head_dim=8, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1)
TYPES = {
    "axk1": BASE | MOE | MLA | dict(n_routed_experts=4),
    "longcat_flash": BASE | MOE | MLA | dict(n_routed_experts=4, zero_expert_num=2, expert_ffn_hidden_size=32,
                                             ffn_hidden_size=128),
    "ergo": BASE | MOE | dict(first_dense_intermediate_size=128, shared_intermediate_size=64, num_experts=4,
                              sliding_window=8),
    "inkling_text": BASE | MOE | dict(n_routed_experts=4, sliding_window_size=8, rel_extent=16),
    "mimo_v2_flash": BASE | MOE | dict(n_routed_experts=4),
    "qwen4_exp_text": BASE | MOE | dict(shared_expert_intermediate_size=32, num_experts=4, hc_lowrank=8,
                                        ngram_vocab_size_base=1000, split_ngram_parts=4, linear_key_head_dim=16,
                                        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                                        layer_types=["linear_attention", "full_attention", "linear_attention"]),
    "dots1": BASE | MOE | dict(n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, sliding_window=8),
    "lfm2_moe": BASE | MOE | dict(num_experts=4, num_dense_layers=1,
                                  layer_types=["conv", "full_attention", "conv"]),
    "gpt_neo": dict(vocab_size=V, hidden_size=H, num_layers=2, num_heads=4, max_position_embeddings=512,
                    attention_types=[[["global", "local"], 1]], window_size=8),
    "dbrx": dict(vocab_size=V, d_model=H, n_heads=4, n_layers=L, max_seq_len=512,
                 attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
                 ffn_config=dict(ffn_hidden_size=2 * H, moe_num_experts=4, moe_top_k=2)),
    "kolibri1_1": BASE | dict(index_num_heads=1),
    "dots3_note_text": BASE | MOE | dict(num_key_value_heads=4, n_routed_experts=4, kv_lora_rank=32, q_lora_rank=32,
                                         qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, index_topk=16,
                                         index_head_dim=16, index_n_heads=2, shared_experts_intermediate_size=32,
                                         sliding_window=8),
    "cohere_compass_text": BASE | dict(sliding_window=8, rope_parameters={
        t: dict(rope_type="default", rope_theta=10000.0) for t in ("full_attention", "sliding_attention")},
                                       layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
}

if __name__ == "__main__":
    matrix.ARCHS.update(TYPES)
    matrix.main_for(ONLY or list(TYPES), getattr(torch, DTYPE))
