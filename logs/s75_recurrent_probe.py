"""Probe (stop 75): can a recurrent/hybrid HF model verify chains exactly with snapshot + deferred replay on its own
DynamicCache? Greedy chains of random drafts (half the time the true next tokens) vs HF greedy generate, float32."""
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

V, H = 96, 64
BASE = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, head_dim=16)


def build(t, extra):
    cfg = AutoConfig.for_model(t, **(BASE | extra))
    cfg.bos_token_id, cfg.eos_token_id = 0, None
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)
    m.generation_config.eos_token_id, m.generation_config.pad_token_id = None, 0
    return m


def snapshot(cache):
    out = []
    for layer in cache.layers:
        d = {}
        for k, v in vars(layer).items():
            if isinstance(v, torch.Tensor):
                d[k] = v.clone() if v.dim() == 0 else v
            elif isinstance(v, dict):
                d[k] = {i: (t.clone() if isinstance(t, torch.Tensor) else t) for i, t in v.items()}
            elif isinstance(v, list):
                d[k] = list(v)
            else:
                d[k] = v
        out.append(d)
    return out


def restore(cache, snap):
    for layer, d in zip(cache.layers, snap):
        vars(layer).clear()
        vars(layer).update(d)


@torch.inference_mode()
def run(m, prompt, n_new, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = DynamicCache(config=m.config)
    out = m(input_ids=prompt[None], past_key_values=cache, use_cache=True)
    ref_root = int(out.logits[0, -1].argmax())
    ids = prompt.tolist() + [ref_root]
    replay = []  # committed tokens not yet run
    root = ref_root
    length = len(prompt)  # tokens whose state is in the cache
    while len(ids) - len(prompt) < n_new:
        k = int(torch.randint(0, 5, (1,), generator=g))
        drafts = torch.randint(2, V, (k,), generator=g).tolist()
        chain = [root] + drafts
        inp = replay + chain
        snap = snapshot(cache) if k else None
        pos = torch.arange(length, length + len(inp))
        o = m(input_ids=torch.tensor([inp]), past_key_values=cache, use_cache=True, position_ids=pos[None])
        logits = o.logits[0, len(replay):]
        j = 0
        nxt = int(logits[0].argmax())
        while j < k and drafts[j] == nxt:
            j += 1
            nxt = int(logits[j].argmax())
        if j == k:
            length += len(inp)
            replay = []
        else:
            restore(cache, snap)
            replay = replay + chain[: j + 1]
        ids += drafts[:j] + [nxt]
        root = nxt
    return ids[len(prompt):][:n_new]


def one(t, extra):
    try:
        m = build(t, extra)
    except Exception as e:
        return f"BUILD {type(e).__name__}: {str(e)[:150]}"
    g = torch.Generator().manual_seed(1)
    res = []
    for n in (7, 19):
        p = torch.randint(2, V, (n,), generator=g)
        try:
            ref = m.generate(p[None], max_new_tokens=24, do_sample=False)[0, n:].tolist()
        except Exception as e:
            return f"HF {type(e).__name__}: {str(e)[:150]}"
        try:
            got = run(m, p, 24)
        except Exception as e:
            import traceback
            traceback.print_exc()
            return f"RUN {type(e).__name__}: {str(e)[:150]}"
        res.append("ok" if got == ref else f"DIFF at {next(i for i, (a, b) in enumerate(zip(got, ref)) if a != b)}")
    return " ".join(res)


TYPES = {
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"] * 2, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32, linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16),
    "qwen3_5_text": dict(layer_types=["linear_attention", "full_attention"] * 2, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16),
    "lfm2": dict(layer_types=["conv", "full_attention"] * 2, block_ff_dim=2 * H),
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=4, num_experts=2, mamba_d_state=8),
    "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"] * 2, mamba_n_heads=4, mamba_d_head=32,
                             mamba_d_state=8, num_local_experts=2, num_experts_per_tok=1),
    "nemotron_h": dict(hybrid_override_pattern="M*M*", mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=8,
                       n_groups=1),
    "mamba": dict(state_size=8),
    "mamba2": dict(num_heads=4, head_dim=32, state_size=8, n_groups=1),
    "falcon_mamba": dict(state_size=8),
    "kimi_linear": dict(pad_token_id=0, bos_token_id=0, eos_token_id=1, layer_types=["linear_attention",
                        "full_attention"] * 2, num_local_experts=4, linear_head_dim=16, linear_num_heads=4),
    "olmo_hybrid": dict(pad_token_id=0, eos_token_id=1),
    "minimax": dict(layer_types=["linear_attention", "full_attention"] * 2, num_local_experts=2),
    "recurrent_gemma": dict(),
    "zamba2": dict(layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], mamba_headdim=16, n_mamba_heads=8,
                   mamba_d_state=8),
    "lfm3": dict(pad_token_id=0, bos_token_id=0, eos_token_id=1),
    "zaya": dict(),
    "llama4_text": dict(num_local_experts=2, attention_chunk_size=8, no_rope_layers=[1, 1, 0, 1]),
    "bloom": dict(n_layer=2, n_head=4),
    "mpt": dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=512),
}

if __name__ == "__main__":
    for t in sys.argv[1:] or TYPES:
        print(f"{t:18s} {one(t, TYPES.get(t, {}))}", flush=True)
