"""Every causal-LM model type transformers knows, built tiny with Llama-like sizes where its config takes them, through
logs/s74_arch_matrix.py's checks (stop 74, a probe): python logs/s74_arch_sweep.py [dtype] [type ...]"""
import os
import sys

import torch
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

DTYPE = sys.argv[1] if len(sys.argv) > 1 else "float32"
START = sys.argv[2] if len(sys.argv) == 3 else None
ONLY = sys.argv[2:] if len(sys.argv) > 3 else None
sys.argv = sys.argv[:2]  # the matrix reads only the dtype
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s74_arch_matrix as matrix  # noqa: E402

ENCODERS = {"bart", "bert", "bert-generation", "big_bird", "bigbird_pegasus", "blenderbot", "blenderbot-small",
            "camembert", "data2vec-text", "electra", "ernie", "marian", "mbart", "megatron-bert", "mvp", "pegasus",
            "plbart", "prophetnet", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "trocr",
            "whisper", "xlm", "xlm-roberta", "xlm-roberta-xl", "xmod", "reformer", "xlnet", "musicgen",
            "musicgen_melody", "moshi", "git", "fuyu", "emu3", "mllama", "got_ocr2", "moss_transcribe_diarize"}

MLA = ("deepseek_v2", "deepseek_v3", "minicpm3", "glm4_moe_lite", "youtu", "sarvam_mla")

if __name__ == "__main__":
    for t in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if t in ENCODERS or t in matrix.ARCHS:
            continue
        matrix.ARCHS[t] = matrix.LLAMA_LIKE | dict(head_dim=16)
    for t in MLA:  # multi-head latent attention: keys wider than values, one KV head per head
        matrix.ARCHS[t] = matrix.LLAMA_LIKE | dict(
            num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
            v_head_dim=16, head_dim=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1)
    todo = [t for t in matrix.ARCHS if t not in ("llama-eager",)]
    if START in todo:  # resume from this model type
        todo = todo[todo.index(START):]
    if ONLY:  # just these
        todo = [t for t in ONLY if t in matrix.ARCHS]
    matrix.main_for(todo, getattr(torch, DTYPE))
