"""Any Hugging Face causal LM: every method on tiny random models of architectures whose modeling code differs where
drafttree meets it (where the decoder layers live, the rotary function's signature, eager attention with softcapping,
sliding windows, fused projections, q/k norms, mixtures of experts, learned positions), against Hugging Face's own
greedy ``generate`` on the same model object, in float32: alone, batched, with a random EAGLE-3 head, and at T=1 with
a seed. Architectures that cannot take a tree get a one-line error (stop 74 found GPT-J, GPT-2 / OPT / Falcon batches
and eager batches failing; ``logs/s74_arch_matrix.py`` runs 25 architectures)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from drafttree.api import SpeculativeModel
from drafttree.errors import DraftTreeError
from drafttree.heads import Eagle3Head
from drafttree.heads.model import EagleHead
from drafttree.models import LoadedModel
from drafttree.target import TargetModel

V, H, L, N = 96, 64, 3, 20
LLAMA_LIKE = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=L, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
# Gemma 4's text model: per-layer inputs (a projection of width 8: the small-GEMM kernel's K < one step), the last two
# layers reusing earlier layers' keys and values
GEMMA4_TEXT = LLAMA_LIKE | dict(num_hidden_layers=4, head_dim=16, sliding_window=8, vocab_size_per_layer_input=V,
                                hidden_size_per_layer_input=8, num_global_key_value_heads=2, global_head_dim=16,
                                num_kv_shared_layers=2, layer_types=["sliding_attention", "full_attention"] * 2)
ARCHS = {  # model_type: (config values, attention implementation)
    "llama": (LLAMA_LIKE, "sdpa"),
    "llama-eager": (LLAMA_LIKE, "eager"),  # a user's choice: batches attend row by row through the eager function
    "gemma2": (LLAMA_LIKE | dict(head_dim=16, sliding_window=8), "eager"),  # softcapping: eager only
    "qwen3": (LLAMA_LIKE | dict(head_dim=16), "sdpa"),
    "phi3": (LLAMA_LIKE | dict(pad_token_id=0), "sdpa"),
    "mixtral": (LLAMA_LIKE | dict(num_local_experts=4), "sdpa"),
    "gpt_neox": (dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=L, num_attention_heads=4,
                      max_position_embeddings=512, rotary_pct=0.25), "sdpa"),
    "gpt2": (dict(vocab_size=V, n_embd=H, n_layer=L, n_head=4, n_positions=512), "sdpa"),
    "gptj": (dict(vocab_size=V, n_embd=H, n_layer=L, n_head=4, n_positions=512, rotary_dim=8), "sdpa"),
    "opt": (dict(vocab_size=V, hidden_size=H, ffn_dim=2 * H, num_hidden_layers=L, num_attention_heads=4,
                 max_position_embeddings=512, word_embed_proj_dim=H), "sdpa"),
    "granite": (LLAMA_LIKE | dict(logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5), "sdpa"),
    "cohere": (LLAMA_LIKE | dict(logit_scale=0.25), "sdpa"),  # logits scaled: sampling must draw from the model's
    # multi-head latent attention: keys (nope + rope) wider than values; the kernels take neither, torch's SDPA does
    "deepseek_v3": (LLAMA_LIKE | dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8,
                                      qk_nope_head_dim=16, v_head_dim=16, head_dim=8, n_routed_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                                      first_k_dense_replace=1, n_group=1, topk_group=1), "sdpa"),
    "falcon": (dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=4,
                    new_decoder_architecture=False, multi_query=True, alibi=False), "sdpa"),
    # two layers (an EAGLE-3 head's default layers 2, L/2, L-3 kept in range), local attention every other layer
    "gpt_neo": (dict(vocab_size=V, hidden_size=H, num_layers=2, num_heads=4, max_position_embeddings=512,
                     attention_types=[[["global", "local"], 1]], window_size=8), "eager"),
    # multimodal wrappers (what `AutoModelForCausalLM` gives for Gemma 3 / 4 checkpoints): their text model runs
    "gemma3": (dict(text_config=LLAMA_LIKE | dict(head_dim=16, sliding_window=8), mm_tokens_per_image=4,
                    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=2, image_size=28, patch_size=14)), "sdpa"),
    "gemma4": (dict(text_config=GEMMA4_TEXT, audio_config=None, vision_config=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)), "sdpa"),
    # Gemma 3n: per-layer inputs, shared KV layers, streams stacked [streams, B, T, H] between layers (AltUp)
    "gemma3n_text": (LLAMA_LIKE | dict(
        num_hidden_layers=6, head_dim=16, sliding_window=8, vocab_size_per_layer_input=V, hidden_size_per_layer_input=8,
        laurel_rank=8, altup_num_inputs=2, num_kv_shared_layers=2, activation_sparsity_pattern=[0.0] * 6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2), "sdpa"),
}


class IdsTokenizer:
    """Token ids as text: generate's text for a model without a tokenizer."""

    all_special_ids: list[int] = []
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{int(i)}>" for i in ids)


def _model(arch: str, values: dict, attention: str) -> torch.nn.Module:
    cfg = AutoConfig.for_model(arch.removesuffix("-eager"), **values)
    for c in (cfg, cfg.get_text_config()):
        c.bos_token_id, c.eos_token_id = 0, None
    cfg._attn_implementation = attention
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # sharpen the random model: its greedy text repeats, so drafts get accepted
        model.get_output_embeddings().weight.mul_(4.0)
    model.requires_grad_(False)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _prompts() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, V, (n,), generator=g) for n in (7, 19, 12)]
    prompts[1][10:16] = prompts[1][:6]  # a repeat for the n-grams
    return prompts


def _hf_greedy(model, prompt: torch.Tensor) -> list[int]:
    with torch.no_grad():
        out = model.generate(prompt[None], attention_mask=torch.ones(1, prompt.numel(), dtype=torch.long),
                             do_sample=False, max_new_tokens=N, min_new_tokens=N)
    return out[0, prompt.numel():].tolist()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_method_gives_hugging_faces_greedy_text_on_this_architecture(arch):
    model = _model(arch, *ARCHS[arch])
    prompts = _prompts()
    refs = [_hf_greedy(model, p) for p in prompts]  # before drafttree touches the model
    with torch.no_grad():
        ref_logits = model(prompts[1][None]).logits[0, -1]
    logits = TargetModel(model).prefill(prompts[1]).logits[-1].float()  # what sampling draws from: the model's own
    assert (logits - ref_logits).abs().max() <= 1e-4 * (1 + ref_logits.abs().max())
    lm = LoadedModel(model, IdsTokenizer(), f"tiny-{arch}", "")
    sm = SpeculativeModel(lm, method="lookup")
    for method in ("ar", "lookup", "auto"):
        assert [sm.generate(p, max_new_tokens=N, method=method, ignore_eos=True).tokens for p in prompts] == refs, \
            method
        batch = sm.generate(list(prompts), max_new_tokens=N, method=method, ignore_eos=True)
        assert [r.tokens for r in batch] == refs, f"batched {method}"
    torch.manual_seed(3)
    head = Eagle3Head(model, draft_vocab=torch.arange(2, V), target_name=lm.name).eval()
    with torch.no_grad():  # not a fresh init: its drafts are its own
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hm = SpeculativeModel(lm, method="eagle2", head=head)
    assert [hm.generate(p, max_new_tokens=N, ignore_eos=True).tokens for p in prompts] == refs, "eagle2"
    assert [r.tokens for r in hm.generate(list(prompts), max_new_tokens=N, method="auto", ignore_eos=True)] == refs
    # T=1 with a seed: every method, and a batch's row i with seed + i, samples what plain sampling samples
    alone = [sm.generate(p, max_new_tokens=N, method="ar", ignore_eos=True, temperature=1.0, seed=5 + i).tokens
             for i, p in enumerate(prompts)]
    assert [sm.generate(p, max_new_tokens=N, method="auto", ignore_eos=True, temperature=1.0, seed=5 + i).tokens
            for i, p in enumerate(prompts)] == alone
    batch = hm.generate(list(prompts), max_new_tokens=N, method="auto", ignore_eos=True, temperature=1.0, seed=5)
    assert [r.tokens for r in batch] == alone


def test_alibi_models_verify_no_tree_in_one_line():
    """ALiBi biases come from a 2-D padding mask: no tree (a chain, tests/test_chain_target.py)."""
    model = _model("bloom", dict(vocab_size=V, hidden_size=H, n_layer=2, n_head=4), "eager")
    with pytest.raises(DraftTreeError, match="bloom models add ALiBi position biases") as e:
        TargetModel(model)
    assert "\n" not in str(e.value)


def test_an_eagle1_head_needs_a_llama_style_target():
    model = _model("gpt2", ARCHS["gpt2"][0], "sdpa")
    with pytest.raises(DraftTreeError, match="use an EAGLE-3 head"):
        EagleHead(model)


@pytest.mark.parametrize("arch,values,message", [
    ("mamba", dict(hidden_size=H, num_hidden_layers=2, state_size=4), "linear_attention layers carry a recurrent"),
    ("jamba", LLAMA_LIKE | dict(num_experts=2), "recurrent state"),
    ("lfm2", LLAMA_LIKE | dict(full_attn_idxs=[1]), "conv layers carry a recurrent state"),
    ("llama4_text", LLAMA_LIKE | dict(head_dim=16, num_local_experts=2), "chunked_attention layers are not supported"),
    # stop 77: CPM-Ant's cached steps disagree with its own full forward; Dory loops its layers over extra cache layers
    ("cpmant", LLAMA_LIKE | dict(head_dim=16), "cached decoding differs from its own full forward"),
    ("dory", LLAMA_LIKE | dict(head_dim=16), "runs its layers in loops"),
])
def test_models_a_tree_cannot_be_verified_on_get_a_one_line_error(arch, values, message):
    """Recurrent layers would advance their state over every branch of a tree; chunked attention needs masks drafttree
    does not build: a tree is refused before any decoding, rather than decoded into other text (such models verify
    chains: tests/test_chain_target.py)."""
    from drafttree.target import check_architecture

    cfg = AutoConfig.for_model(arch, **values)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(DraftTreeError, match=message) as e:
        check_architecture(model)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("arch,values,message", [
    ("modernbert-decoder", LLAMA_LIKE | dict(head_dim=16, pad_token_id=1), "its logits are not its output embeddings"),
    ("openai-gpt", dict(vocab_size=V, n_embd=H, n_layer=2, n_head=4), "keeps no KV cache"),
])
def test_models_whose_logits_or_cache_are_not_a_trees_get_a_one_line_error(arch, values, message):
    """ModernBERT's decoder makes its logits through a prediction head of its own (its greedy text differed from
    Hugging Face's before this check); GPT-1 keeps no cache."""
    model = _model(arch, values, "eager")
    with pytest.raises(DraftTreeError, match=message) as e:
        TargetModel(model)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("arch,values,attention", [
    ("xglm", dict(vocab_size=V, d_model=H, ffn_dim=2 * H, num_layers=2, attention_heads=4, max_position_embeddings=512),
     "eager"),
    ("doge", LLAMA_LIKE | dict(head_dim=16), "sdpa"),
])
def test_a_model_whose_attention_is_its_own_decodes_a_batch_one_prompt_at_a_time(arch, values, attention):
    """XGLM attends in code of its own (no attention interface), and Doge's dynamic-mask attention shapes its mask by
    the batch's query length (stop 74: a shape error on packed drafted rows): neither can attend packed rows, so a list
    of prompts is decoded one at a time (exactly), and a second row is refused in one line."""
    model = _model(arch, values, attention)
    prompts = _prompts()
    refs = [_hf_greedy(model, p) for p in prompts]
    sm = SpeculativeModel(LoadedModel(model, IdsTokenizer(), f"tiny-{arch}", ""), method="lookup")
    assert [sm.generate(p, max_new_tokens=N, ignore_eos=True).tokens for p in prompts] == refs
    assert [r.tokens for r in sm.generate(list(prompts), max_new_tokens=N, ignore_eos=True)] == refs
    target = sm.batch_target()
    assert target.max_rows == 1 and target.rows == 0
    target.add(prompts[0])
    with pytest.raises(DraftTreeError, match="decodes 1 prompt\\(s\\) at a time") as e:
        target.add(prompts[1])
    assert "\n" not in str(e.value) and target.rows == 1
