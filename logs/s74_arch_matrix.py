"""Every method on tiny random models of many transformers architectures, against Hugging Face's own greedy generate
(stop 74, a probe): python logs/s74_arch_matrix.py [dtype] [arch ...]

Per architecture: load (a random model from its config class), then drafttree's methods one prompt at a time and as a
batch of three, each compared token for token with `model.generate(do_sample=False)` on the same model object."""
import sys
import traceback

import torch
from transformers import AutoConfig, AutoModelForCausalLM

torch.set_num_threads(2)
from drafttree.api import SpeculativeModel  # noqa: E402
from drafttree.heads import Eagle3Head  # noqa: E402
from drafttree.models import LoadedModel  # noqa: E402

V, H, L = 96, 64, 3
LLAMA_LIKE = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=L, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
ARCHS = {
    "llama": LLAMA_LIKE, "mistral": LLAMA_LIKE | dict(sliding_window=None), "qwen2": LLAMA_LIKE,
    "qwen3": LLAMA_LIKE | dict(head_dim=16), "phi3": LLAMA_LIKE | dict(pad_token_id=0),
    "gemma": LLAMA_LIKE | dict(head_dim=16), "gemma2": LLAMA_LIKE | dict(head_dim=16, sliding_window=8),
    "gemma3_text": LLAMA_LIKE | dict(head_dim=16, sliding_window=8), "olmo2": LLAMA_LIKE, "olmo": LLAMA_LIKE,
    "granite": LLAMA_LIKE | dict(embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=4.0,
                                 attention_multiplier=0.2),
    "stablelm": LLAMA_LIKE | dict(partial_rotary_factor=0.5), "starcoder2": LLAMA_LIKE | dict(sliding_window=None),
    "cohere": LLAMA_LIKE, "smollm3": LLAMA_LIKE | dict(no_rope_layer_interval=2, pad_token_id=1),
    "glm": LLAMA_LIKE | dict(head_dim=16, pad_token_id=1),
    "phi": LLAMA_LIKE | dict(partial_rotary_factor=0.5), "mixtral": LLAMA_LIKE | dict(num_local_experts=4),
    "qwen2_moe": LLAMA_LIKE | dict(num_experts=4, moe_intermediate_size=H, shared_expert_intermediate_size=H),
    "gpt2": dict(vocab_size=V, n_embd=H, n_layer=L, n_head=4, n_positions=512),
    "gpt_neox": dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=L, num_attention_heads=4,
                     max_position_embeddings=512, rotary_pct=0.25),
    "gptj": dict(vocab_size=V, n_embd=H, n_layer=L, n_head=4, n_positions=512, rotary_dim=8),
    "falcon": dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=4,
                   new_decoder_architecture=False, multi_query=True, alibi=False),
    "bloom": dict(vocab_size=V, hidden_size=H, n_layer=L, n_head=4),
    "llama-eager": {},
    "opt": dict(vocab_size=V, hidden_size=H, ffn_dim=2 * H, num_hidden_layers=L, num_attention_heads=4,
                max_position_embeddings=512, word_embed_proj_dim=H),
}


class IdsTokenizer:
    """Token ids as text ("<5><17>"): enough for generate's text of a model without a tokenizer."""

    all_special_ids: list[int] = []
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{int(i)}>" for i in ids)


def build(arch: str, dtype: torch.dtype):
    eager = arch.endswith("-eager")
    arch = arch.removesuffix("-eager")
    cfg = AutoConfig.for_model(arch, **ARCHS[arch])
    cfg.bos_token_id, cfg.eos_token_id = 0, None
    if getattr(cfg, "pad_token_id", None) is not None and cfg.pad_token_id >= V:
        cfg.pad_token_id = 1
    cfg._attn_implementation = "eager" if eager or arch in ("gemma2", "bloom") else "sdpa"
    with torch.device("meta"):  # the model's own choice where it takes no SDPA (as from_pretrained makes it)
        try:
            AutoModelForCausalLM.from_config(cfg)
        except ValueError as e:
            if "scaled_dot_product_attention" not in str(e):
                raise
            cfg._attn_implementation = "eager"
    with torch.device("meta"):  # a model type whose other defaults make it big is not built at all
        size = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    if size > 150_000_000:
        raise ValueError(f"{size / 1e6:.0f}M parameters with these sizes")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    with torch.no_grad():  # sharpen the random model so that greedy text repeats (drafts get accepted)
        out = model.get_output_embeddings()
        out.weight.mul_(4.0)
    model.requires_grad_(False)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def main():
    dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float32
    main_for(sys.argv[2:] or list(ARCHS), dtype)


def main_for(archs: list[str], dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, V, (n,), generator=g) for n in (7, 19, 12)]
    prompts[1][10:16] = prompts[1][:6]  # a repeat for the n-grams
    N = 24
    for arch in archs:
        try:
            model = build(arch, dtype)
        except Exception as e:
            print(f"{arch:12s} BUILD {type(e).__name__}: {str(e)[:150]}", flush=True)
            continue
        refs = []
        try:
            for p in prompts:
                with torch.no_grad():
                    out = model.generate(p[None], attention_mask=torch.ones(1, p.numel(), dtype=torch.long),
                                         do_sample=False, max_new_tokens=N, min_new_tokens=N)
                refs.append(out[0, p.numel():].tolist())
        except Exception as e:  # the tiny config does not suit this model type: not ours to judge
            print(f"{arch:12s} HF-GENERATE {type(e).__name__}: {str(e)[:150]}", flush=True)
            continue
        res = {}
        try:
            sm = SpeculativeModel(LoadedModel(model, IdsTokenizer(), f"tiny-{arch}", ""), method="lookup")
        except Exception as e:
            print(f"{arch:12s} LOAD {type(e).__name__}: {e}", flush=True)
            continue
        for method in ("ar", "lookup", "auto"):
            try:
                got = [sm.generate(p, max_new_tokens=N, method=method, ignore_eos=True).tokens for p in prompts]
                res[method] = "ok" if got == refs else "DIFF " + str(
                    [i for i, (a, b) in enumerate(zip(got, refs)) if a != b])
            except Exception as e:
                res[method] = f"ERR {type(e).__name__}: {str(e)[:120]}"
                traceback.print_exc(limit=-6, file=sys.stderr)
        for method in ("ar", "lookup"):
            try:
                got = [r.tokens for r in sm.generate(list(prompts), max_new_tokens=N, method=method, ignore_eos=True)]
                res["batch-" + method] = "ok" if got == refs else "DIFF " + str(
                    [i for i, (a, b) in enumerate(zip(got, refs)) if a != b])
            except Exception as e:
                res["batch-" + method] = f"ERR {type(e).__name__}: {str(e)[:120]}"
                traceback.print_exc(limit=-6, file=sys.stderr)
        try:  # a random EAGLE-3 head (its own Llama layer over three of the target's layers): any target's
            torch.manual_seed(3)
            head = Eagle3Head(model, draft_vocab=torch.arange(2, V), target_name=f"tiny-{arch}").to(dtype).eval()
            with torch.no_grad():
                for prm in head.parameters():
                    prm.add_(0.05 * torch.randn_like(prm))
            hm = SpeculativeModel(LoadedModel(model, IdsTokenizer(), f"tiny-{arch}", ""), method="eagle2", head=head)
            for method in ("eagle2", "auto"):
                got = [hm.generate(p, max_new_tokens=N, method=method, ignore_eos=True).tokens for p in prompts]
                res["e3-" + method] = "ok" if got == refs else "DIFF"
            got = [r.tokens for r in hm.generate(list(prompts), max_new_tokens=N, method="auto", ignore_eos=True)]
            res["e3-batch-auto"] = "ok" if got == refs else "DIFF"
        except Exception as e:
            res["e3"] = f"ERR {type(e).__name__}: {str(e)[:120]}"
            traceback.print_exc(limit=-6, file=sys.stderr)
        try:  # T=1 with a seed: every method (and a batch) samples what plain sampling with that seed samples
            ref1 = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, temperature=1.0, seed=5).tokens
                    for p in prompts]
            ref_rows = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, temperature=1.0,
                                    seed=5 + i).tokens for i, p in enumerate(prompts)]  # a batch's row i: seed + i
            for method in ("lookup", "auto"):
                got = [sm.generate(p, max_new_tokens=N, method=method, ignore_eos=True, temperature=1.0, seed=5).tokens
                       for p in prompts]
                res["t1-" + method] = "ok" if got == ref1 else "DIFF"
            got = [r.tokens for r in sm.generate(list(prompts), max_new_tokens=N, method="auto", ignore_eos=True,
                                                 temperature=1.0, seed=5)]
            res["t1-batch-auto"] = "ok" if got == ref_rows else "DIFF"
        except Exception as e:
            res["t1"] = f"ERR {type(e).__name__}: {str(e)[:120]}"
            traceback.print_exc(limit=-6, file=sys.stderr)
        print(f"{arch:12s} " + "  ".join(f"{k}={v}" for k, v in res.items()), flush=True)


if __name__ == "__main__":
    main()
