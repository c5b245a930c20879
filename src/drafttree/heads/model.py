"""The EAGLE draft head and its checkpoint format.

The head drafts at the feature level: input at position t is ``fc([emb(token t+1); feature(t)])``
(2H -> H), then decoder layer(s) **of the target's own architecture** (built from the target's config
through transformers, so Llama, Qwen2, Gemma3, ... need no hand-written copies); its output predicts the
target's feature at t+1, which the target's frozen LM head turns into draft logits. As in EAGLE-1, layer
0 has no input norm (its input is fc's output, already on the feature scale) and there is no final norm.

Checkpoint: ``config.json`` + ``model.safetensors`` with EAGLE-1's keys (``fc.weight``, ``fc.bias``,
``layers.0.*``). Embeddings and LM head are the target's and are not stored. Optional ``d2t`` / ``t2d``
(EAGLE-3 convention) describe a reduced draft vocabulary: draft id i is token ``i + d2t[i]``.
``config.json["drafttree"]`` records the target the head was trained for. Loading (any published layout):
:mod:`drafttree.heads.loading`.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from drafttree import kernels
from drafttree.cache import cache_arg
from drafttree.errors import DraftTreeError
from drafttree.kernels.memory import huge_page_copy
from drafttree.models import text_only

FORMAT = "drafttree-eagle1"


def _layer_config(target_config, num_layers: int, intermediate_size: int | None = None):
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = num_layers
    if intermediate_size:  # a head whose MLP width differs from the target's
        cfg.intermediate_size = int(intermediate_size)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = ["full_attention"] * num_layers
    cfg._attn_implementation = "sdpa"
    return cfg


def rotary_of(target_model: nn.Module) -> tuple[list[nn.Module], dict]:
    """The target's own rotary embedding (same positions, same precision; in a list: not the head's submodule) and
    the keywords that ask it for full attention's table (Gemma-3 keeps one per layer type: sliding / full), or for
    the one table the target has."""
    rotary = target_model.base_model.rotary_emb
    kw = {}
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        known = sorted(set(getattr(target_model.config, "layer_types", None) or ["full_attention"]))
        kw = {"layer_type": "full_attention" if "full_attention" in known else known[0]}
    return [rotary], kw


class EagleHead(nn.Module):
    kind = "eagle"  # EAGLE-1/2 layout: drafts from the target's last hidden state
    def __init__(self, target_model: nn.Module, num_layers: int = 1, draft_vocab: torch.Tensor | None = None,
                 target_name: str = "", fc_bias: bool = True, intermediate_size: int | None = None):
        super().__init__()
        target_model = text_only(target_model)
        base = target_model.base_model
        if not isinstance(getattr(base, "layers", None), nn.ModuleList) or not hasattr(base, "rotary_emb"):
            raise DraftTreeError(f"an EAGLE-1 head is built from its target's own decoder layer and rotary embedding "
                                 f"(Llama-style models); {type(base).__name__} has no `layers` with a `rotary_emb`: "
                                 "use an EAGLE-3 head (train --head-kind eagle3)")
        self.target_config = target_model.config
        self.config = _layer_config(target_model.config, num_layers, intermediate_size)
        self.target_name = target_name
        h = self.config.hidden_size
        layer_cls = type(base.layers[0])
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        self.layers = nn.ModuleList([layer_cls(self.config, i) for i in range(num_layers)])
        self.layers[0].input_layernorm = nn.Identity()
        self._rotary, self._rotary_kw = rotary_of(target_model)
        # frozen, shared with the target, never saved
        self._embed = [base.get_input_embeddings()]
        self._lm_head = [target_model.get_output_embeddings()]
        self.target_params = sum(p.numel() for p in target_model.parameters())
        self.set_draft_vocab(draft_vocab)

    # -- vocabulary ------------------------------------------------------------------------------------
    def set_draft_vocab(self, draft_vocab: torch.Tensor | None) -> None:
        """Restrict draft logits to these token ids (None = the full vocabulary)."""
        self.draft_vocab = None if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long)
        self._small_head = None

    @property
    def embed_tokens(self) -> nn.Module:
        return self._embed[0]

    @property
    def lm_head(self) -> nn.Module:
        return self._lm_head[0]

    @property
    def target_vocab_size(self) -> int:
        return self.lm_head.weight.shape[0]

    def level_cost(self) -> float:
        """One drafting level's cost in target forwards: the bytes it reads (its layers and its LM-head rows)
        over the target's. A model, not a measurement, so that gates do not sway with the machine's load."""
        own = sum(p.numel() for p in self.parameters()) + self.draft_head_weight().numel()
        return own / max(1, self.target_params)

    def draft_head_weight(self) -> torch.Tensor:
        """LM-head rows of the draft vocabulary (cached; the target's LM head is frozen)."""
        w = self.lm_head.weight
        if self.draft_vocab is None:
            return w
        if self._small_head is None or self._small_head.device != w.device or self._small_head.dtype != w.dtype:
            self._small_head = huge_page_copy(w.detach()[self.draft_vocab.to(w.device)].contiguous())
        return self._small_head

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        return kernels.linear(features, self.draft_head_weight())

    # -- forward ---------------------------------------------------------------------------------------
    def forward(self, features: torch.Tensor, next_ids: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, cache=None) -> torch.Tensor:
        """features [B, T, H] at t, next_ids [B, T] tokens t+1 -> predicted features at t+1 [B, T, H]."""
        emb = self.embed_tokens(next_ids).to(self.fc.weight.dtype)
        h = self.fc(torch.cat([emb, features.to(self.fc.weight.dtype)], dim=-1))
        pos_emb = self._rotary[0](h, position_ids, **self._rotary_kw)
        for layer in self.layers:
            out = layer(h, attention_mask=attention_mask, position_ids=position_ids, use_cache=cache is not None,
                        position_embeddings=pos_emb, **{cache_arg(layer): cache})
            h = out[0] if isinstance(out, tuple) else out
        return h

    # -- checkpoint ------------------------------------------------------------------------------------
    def trainable_state(self) -> dict[str, torch.Tensor]:
        return dict(self.state_dict())

    def save(self, path: str | Path, dtype: torch.dtype | None = torch.bfloat16, extra: dict | None = None) -> None:
        """Write config.json + model.safetensors atomically (a temp dir renamed into place)."""
        state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous().cpu()
                 for k, v in self.trainable_state().items()}
        if self.draft_vocab is not None:
            ids = self.draft_vocab.cpu()
            state["d2t"] = ids - torch.arange(ids.numel())
            t2d = torch.zeros(self.target_config.vocab_size, dtype=torch.bool)
            t2d[ids] = True
            state["t2d"] = t2d
        cfg = self.config.to_dict()
        for k in ("_attn_implementation_autoset", "transformers_version", "_name_or_path"):
            cfg.pop(k, None)
        cfg["bias"] = self.fc.bias is not None
        cfg["architectures"] = [type(self.layers[0]).__name__.replace("DecoderLayer", "ForCausalLM")]
        cfg["drafttree"] = {
            "format": FORMAT,
            "num_layers": len(self.layers),
            "draft_vocab_size": None if self.draft_vocab is None else int(self.draft_vocab.numel()),
            "target": target_signature(self.target_config, self.target_name, self.lm_head.weight.shape[0]),
            **(extra or {}),
        }
        write_checkpoint(path, cfg, state)


def write_checkpoint(path: str | Path, cfg: dict, state: dict[str, torch.Tensor],
                     weights: str = "model.safetensors") -> None:
    """Write config.json + weights atomically (a temp dir renamed into place)."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    if weights.endswith(".bin"):
        torch.save(state, tmp / weights)
    else:
        save_file(state, str(tmp / weights), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1, default=str))
    if path.exists():
        old = path.with_name(path.name + f".old{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    else:
        os.replace(tmp, path)


def target_signature(config, name: str, vocab_size: int) -> dict:
    arch = (getattr(config, "architectures", None) or [None])[0]
    return {"name": name, "architecture": arch, "model_type": config.model_type,
            "hidden_size": config.hidden_size, "vocab_size": int(vocab_size),
            "num_hidden_layers": config.num_hidden_layers}
