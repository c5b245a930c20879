"""The EAGLE-3 draft head, built from stock `transformers` Llama parts (no forked modeling code).

It drafts from a fusion of the target's hidden states entering layers ``aux_layers`` (by default 2, L/2
and L-3, as in EAGLE-3 and vLLM): ``fc`` maps their concatenation (3H) to H. Its decoder layer attends over
``[input_layernorm(token embedding); hidden_norm(h)]`` (2H wide: the stock Llama attention with wider q/k/v
projections) with ``h`` as the residual, and its own LM head reads ``norm(h)`` over a reduced draft vocabulary
(``d2t``: target id = draft id + d2t[draft id]). Later drafting steps feed the layer's own output back in place
of the fused feature (no ``fc``). Published heads are Llama layers whatever the target (SpecForge, vLLM), so
this head is too; three published variants are honoured: ``norm_before_residual`` (the residual is
``hidden_norm(h)``), ``norm_before_fc`` (one RMSNorm over the 3H input) and ``norm_output`` (the normed output
is fed back and read by the LM head without another norm).

Same interface as :class:`~drafttree.heads.model.EagleHead`: ``forward(features, next_ids, positions, mask,
cache)`` returns the features to feed back, ``draft_logits`` scores the draft vocabulary, ``draft_vocab``
maps its rows to target ids.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from drafttree import kernels
from drafttree.cache import cache_arg
from drafttree.errors import DraftTreeError
from drafttree.heads.eagle3_format import VARIANTS, checkpoint_of, default_aux_layers, layer_config_from, write_eagle3
from drafttree.heads.model import write_checkpoint
from drafttree.models import text_only
from drafttree.target import layer_count


class Eagle3Layer(nn.Module):
    """A Llama decoder layer whose attention reads the normed embedding and the normed hidden state side by side."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False):
        super().__init__()
        h = config.hidden_size
        layer = LlamaDecoderLayer(config, 0)
        self.self_attn, self.mlp = layer.self_attn, layer.mlp
        for name in ("q_proj", "k_proj", "v_proj"):  # 2H inputs: [embedding; hidden]
            old = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * h, old.out_features, bias=old.bias is not None))
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, emb: torch.Tensor, hidden: torch.Tensor, attention_mask, position_ids, position_embeddings,
                cache=None) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(emb), normed], dim=-1)
        out = self.self_attn(hidden_states=x, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=cache is not None, position_embeddings=position_embeddings,
                             **{cache_arg(self.self_attn): cache})
        h = residual + (out[0] if isinstance(out, tuple) else out)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    kind = "eagle3"

    def __init__(self, target_model: nn.Module, config: LlamaConfig | None = None,
                 draft_vocab: torch.Tensor | None = None, aux_layers: list[int] | None = None,
                 target_name: str = "", **variants: bool):
        super().__init__()
        bad = sorted(set(variants) - set(VARIANTS))
        if bad:
            raise ValueError(f"unknown EAGLE-3 variant(s) {bad}")
        self.variants = {k: bool(variants.get(k, False)) for k in VARIANTS}
        target_model = text_only(target_model)
        self.config = config if config is not None else layer_config_from(target_model.config)
        self.target_config = target_model.config
        self.target_name = target_name
        n = layer_count(target_model)
        self.aux_layers = list(aux_layers) if aux_layers is not None else default_aux_layers(n)
        if len(self.aux_layers) < 2:  # the fused width (k x H) is how a step tells target features from its own
            raise DraftTreeError(f"an EAGLE-3 head fuses at least 2 target layers, got {self.aux_layers}")
        h = self.config.hidden_size
        lm = target_model.get_output_embeddings().weight
        ids = torch.arange(lm.shape[0]) if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long)
        self.fc = nn.Linear(len(self.aux_layers) * h, h, bias=False)
        if self.variants["norm_before_fc"]:
            self.input_norm = LlamaRMSNorm(len(self.aux_layers) * h, eps=self.config.rms_norm_eps)
        self.midlayer = Eagle3Layer(self.config, self.variants["norm_before_residual"])
        self.norm = LlamaRMSNorm(h, eps=self.config.rms_norm_eps)
        self.lm_head = nn.Linear(h, ids.numel(), bias=False)
        self.register_buffer("draft_vocab", ids, persistent=False)
        self._rotary = [LlamaRotaryEmbedding(self.config)]  # kept out of .to(dtype): float32 frequencies
        self._embed = [target_model.get_input_embeddings()]  # frozen, the target's, never saved
        self.target_params = sum(p.numel() for p in target_model.parameters())
        self.target_vocab_size = int(lm.shape[0])
        with torch.no_grad():  # start from the target's LM-head rows of the draft vocabulary
            self.lm_head.weight.copy_(lm[ids].float())

    @property
    def embed_tokens(self) -> nn.Module:
        return self._embed[0]

    def level_cost(self) -> float:
        """One drafting level's cost in target forwards (bytes read: the head's weights over the target's)."""
        return sum(p.numel() for p in self.parameters()) / max(1, self.target_params)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        return kernels.linear(out if self.variants["norm_output"] else self.norm(out), self.lm_head.weight)

    def forward(self, features: torch.Tensor, next_ids: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, cache=None) -> torch.Tensor:
        """features [B, T, 3H] (the target's fused layers) or [B, T, H] (this head's own output, fed back)."""
        dtype = self.fc.weight.dtype
        emb = self.embed_tokens(next_ids).to(dtype)
        h = features.to(dtype)
        if h.shape[-1] == self.fc.in_features:
            h = self.fc(self.input_norm(h) if self.variants["norm_before_fc"] else h)
        rotary = self._rotary[0]
        if rotary.inv_freq.device != h.device:
            self._rotary[0] = rotary = rotary.to(h.device)
        h = self.midlayer(emb, h, attention_mask, position_ids, rotary(h, position_ids), cache)
        return self.norm(h) if self.variants["norm_output"] else h

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return dict(self.state_dict())

    def save(self, path, dtype: torch.dtype | None = torch.bfloat16, extra: dict | None = None) -> None:
        """drafttree's layout: SGLang's (``LlamaForCausalLMEagle3``, ``midlayer.*``) plus a ``drafttree`` block."""
        cfg, state = write_eagle3(checkpoint_of(self, dtype), "drafttree")
        cfg["drafttree"].update(extra or {})
        write_checkpoint(path, cfg, state)
