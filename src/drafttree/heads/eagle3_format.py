"""EAGLE-3 checkpoints as published: read any layout into one canonical form, write it in any layout.

Layouts: ``drafttree`` (SGLang's plus a ``drafttree`` block), ``eagle`` (the EAGLE repo: ``LlamaForCausalLM`` +
``draft_vocab_size``), ``sglang`` / SpecForge (``LlamaForCausalLMEagle3``, ``eagle_config.
eagle_aux_hidden_state_layer_ids`` counting layer *outputs*), ``vllm`` (the same keys, top-level ids counting
layer *inputs*, ``norm_before_residual``) and ``speculators`` (``Eagle3Speculator``, ``transformer_layer_config``,
``layers.0.*``, ids counting layer inputs). Canonically, aux layers are the target layers whose *inputs* are
fused (EAGLE-3's 2, L/2, L-3), and the decoder layer's weights are ``midlayer.*``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import LlamaConfig

from drafttree.errors import DraftTreeError

LAYOUTS = ("drafttree", "eagle", "sglang", "vllm", "speculators")

VARIANTS = ("norm_before_residual", "norm_before_fc", "norm_output")
LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
              "hidden_act", "attention_bias", "mlp_bias", "vocab_size")


def default_aux_layers(num_layers: int) -> list[int]:
    """Inputs of layers 2, L/2 and L-3 (EAGLE-3's and vLLM's default), kept in range for models of under 3 layers."""
    return [min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3)]


def _attribute(config: object, key: str):
    """``config.key``, or None where the config has none or only per layer (Gemma-4's head_dim: the head's own)."""
    try:
        return getattr(config, key, None)
    except Exception:
        return None


def layer_config_from(config: dict | object) -> LlamaConfig:
    """A one-layer Llama config with the sizes of ``config`` (a head's config dict or a target's config)."""
    # a target's config by attribute: its attribute map names GPT-2's n_embd / n_head the Llama way
    d = config if isinstance(config, dict) else {k: _attribute(config, k) for k in LAYER_KEYS}
    kw = {k: d[k] for k in LAYER_KEYS if d.get(k) is not None}
    if isinstance(kw.get("intermediate_size"), (list, tuple)):  # per layer (Gemma 3n): the head's, the widest
        kw["intermediate_size"] = max(kw["intermediate_size"])
    if "intermediate_size" not in kw and kw.get("hidden_size"):  # GPT-2 style (n_inner unset): 4 x the width
        kw["intermediate_size"] = 4 * kw["hidden_size"]
    if "head_dim" not in kw and kw.get("hidden_size") and kw.get("num_attention_heads"):
        kw["head_dim"] = kw["hidden_size"] // kw["num_attention_heads"]
    cfg = LlamaConfig(**kw, num_hidden_layers=1)
    cfg._attn_implementation = "sdpa"
    return cfg


@dataclass
class Eagle3Checkpoint:
    layer: dict  # one-layer Llama config values; vocab_size = the target's vocabulary
    state: dict[str, torch.Tensor]  # fc, midlayer.*, norm, lm_head, [input_norm], d2t, t2d
    aux_layers: list[int] | None = None  # None: the engines' default (2, L/2, L-3)
    variants: dict = field(default_factory=dict)
    target: dict = field(default_factory=dict)  # what the head was trained for, when known


def read_eagle3(cfg: dict, state: dict[str, torch.Tensor], layout: str, where: str = "head") -> Eagle3Checkpoint:
    """``layout``: 'speculators' or 'eagle3' (the EAGLE repo, SpecForge, SGLang, vLLM and drafttree share keys)."""
    meta = cfg.get("drafttree", {})
    if layout == "speculators":
        layer = dict(cfg.get("transformer_layer_config") or {})
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        variants = {"norm_before_residual": bool(cfg.get("norm_before_residual", True)),  # as vLLM reads it
                    "norm_before_fc": bool(cfg.get("norm_before_fc", False)),
                    "norm_output": bool(cfg.get("norm_output", False))}
    else:
        layer = {k: v for k, v in cfg.items() if k not in ("drafttree", "eagle_config")}
        variants = {"norm_before_residual": bool(cfg.get("norm_before_residual", False)),
                    **{k: bool(v) for k, v in meta.get("variants", {}).items()}}
        if cfg.get("norm_output") is False:
            raise DraftTreeError(f"{where}: SpecForge's norm_output=false (logits without the final norm) is not "
                                 "supported")
    bad = sorted(set(variants) - set(VARIANTS))
    if bad:
        raise DraftTreeError(f"{where}: unknown EAGLE-3 variant(s) {bad}")
    if cfg.get("fc_norm") or any(k.startswith("fc_norm.") for k in state):
        raise DraftTreeError(f"{where}: per-layer fc_norm heads are not supported")
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise DraftTreeError(f"{where}: EAGLE-3 heads with {layer['num_hidden_layers']} decoder layers are not "
                             "supported (one layer)")
    if cfg.get("target_hidden_size") not in (None, layer.get("hidden_size")):
        raise DraftTreeError(f"{where}: target_hidden_size {cfg['target_hidden_size']} differs from the head's "
                             f"{layer.get('hidden_size')}: not supported")
    if meta.get("aux_layers") is not None:
        aux = list(meta["aux_layers"])
    elif cfg.get("eagle_aux_hidden_state_layer_ids") is not None:  # vLLM / speculators: layer inputs
        aux = list(cfg["eagle_aux_hidden_state_layer_ids"])
    elif (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") is not None:
        aux = [int(i) + 1 for i in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]  # layer outputs
    else:
        aux = None
    return Eagle3Checkpoint(layer, state, aux, variants, dict(meta.get("target", {})))


def checkpoint_of(head, dtype: torch.dtype | None = torch.bfloat16) -> Eagle3Checkpoint:
    from drafttree.heads.model import target_signature

    state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().contiguous().cpu()
             for k, v in head.state_dict().items()}
    ids = head.draft_vocab.cpu()
    state["d2t"] = ids - torch.arange(ids.numel())
    t2d = torch.zeros(head.target_vocab_size, dtype=torch.bool)
    t2d[ids] = True
    state["t2d"] = t2d
    d = head.config.to_dict()
    layer = {k: d[k] for k in LAYER_KEYS if d.get(k) is not None}
    layer["vocab_size"] = head.target_vocab_size
    return Eagle3Checkpoint(layer, state, list(head.aux_layers), dict(head.variants),
                            target_signature(head.target_config, head.target_name, head.target_vocab_size))


def _layer_for_readers(layer: dict) -> dict:
    out = {k: v for k, v in layer.items() if k in LAYER_KEYS and k != "rope_parameters"}
    rope = layer.get("rope_parameters") or {}
    out["rope_theta"] = rope.get("rope_theta", layer.get("rope_theta", 10000.0))  # older readers want rope_theta
    if rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    out.update(model_type="llama", num_hidden_layers=1, tie_word_embeddings=False)
    return out


def write_eagle3(ck: Eagle3Checkpoint, layout: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors) in ``layout``, aux layer ids in each reader's convention."""
    if layout not in LAYOUTS:
        raise DraftTreeError(f"unknown EAGLE-3 layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    v = {k: bool(ck.variants.get(k, False)) for k in VARIANTS}
    readable = {"drafttree": VARIANTS, "speculators": VARIANTS, "vllm": ("norm_before_residual",)}.get(layout, ())
    unsupported = [k for k in VARIANTS if v[k] and k not in readable]
    if unsupported:
        raise DraftTreeError(f"the {layout} layout cannot express this head's {', '.join(unsupported)}")
    state = {k: t for k, t in ck.state.items() if k != "embed_tokens.weight"}
    layer = _layer_for_readers(ck.layer)
    draft = int(state["lm_head.weight"].shape[0])
    if layout == "speculators":
        state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): t for k, t in state.items()}
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "transformer_layer_config": {**layer, "architectures": ["LlamaForCausalLM"]},
               "draft_vocab_size": draft, "target_hidden_size": None, **v,
               "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                      "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
                                      "verifier": {"name_or_path": ck.target.get("name"),
                                                   "architectures": [ck.target.get("architecture")]}}}
        if ck.aux_layers is not None:
            cfg["eagle_aux_hidden_state_layer_ids"] = list(ck.aux_layers)
        return cfg, state
    arch = "LlamaForCausalLM" if layout == "eagle" else "LlamaForCausalLMEagle3"
    cfg = {**layer, "architectures": [arch], "draft_vocab_size": draft, "bias": False}
    if ck.aux_layers is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in ck.aux_layers]}
        if layout == "vllm":
            cfg["eagle_aux_hidden_state_layer_ids"] = list(ck.aux_layers)
    if layout in ("vllm", "drafttree"):
        cfg["norm_before_residual"] = v["norm_before_residual"]
    if layout == "drafttree":
        cfg["drafttree"] = {"format": "drafttree-eagle3", "aux_layers": ck.aux_layers, "variants": v,
                            "target": ck.target}
    return cfg, state
