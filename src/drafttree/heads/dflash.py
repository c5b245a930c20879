"""DFlash drafters (z-lab's block-diffusion drafters, ``DFlashDraftModel``), loaded as they are published.

A DFlash drafter drafts a whole block in one forward: the block is the root (the token the target just chose) followed
by ``block_size - 1`` mask tokens, embedded with the target's own embedding table, and every position of it is
"denoised" into a draft token at once (the target's LM head on the drafter's output). It reads the target through its
keys and values only: the target's hidden states at ``target_layer_ids`` (layer outputs, so the inputs of the layers
one later), concatenated, projected by ``fc`` and normed (``hidden_norm``), are the *context* every drafter layer
projects into keys and values (``k_proj``/``v_proj``, keys normed and rotated at their positions) beside the block's
own. The block attends to all of it, and to itself in both directions (a layer with ``layer_types`` sliding attention
or ``is_causal`` true is masked as the published code masks it). The context's keys and values are kept from round to
round (the drafter's cache); the block's are recomputed each round.

Checkpoint (``config.json``: a Qwen3 config, ``architectures: ["DFlashDraftModel"]``, ``dflash_config:
{target_layer_ids, mask_token_id}``, ``block_size``): ``fc.weight`` [H, k*H], ``hidden_norm.weight``, ``norm.weight``
and ``layers.<i>.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm,
mlp.{gate,up,down}_proj}`` (Qwen3 decoder layers: their modules hold the weights here, this file runs them). DFlash2
drafters (causal convolutions and a candidate selector) are refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from drafttree.errors import DraftTreeError

ARCHITECTURE = "DFlashDraftModel"


def is_dflash(cfg: dict) -> bool:
    """Whether a head directory's config describes a DFlash drafter (either generation)."""
    arch = " ".join(cfg.get("architectures") or [])
    return "DFlash" in arch or "dflash_config" in cfg


def _value(cfg: dict, name: str, default=None):
    """A DFlash setting: ``dflash_config`` first (newer checkpoints), then the top level (older ones)."""
    inner = cfg.get("dflash_config") or {}
    return inner.get(name, cfg.get(name, default))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DFlashHead(nn.Module):
    """A DFlash drafter for ``target_model`` (drafters/dflash.py steps it through chains and trees)."""

    kind = "dflash"
    draft_vocab = None  # drafts over the target's whole vocabulary (its LM head)

    def __init__(self, cfg: dict, target_model: nn.Module, where: str = "DFlash drafter"):
        super().__init__()
        from transformers import AutoConfig
        from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding

        fields = {k: v for k, v in cfg.items() if k not in ("architectures", "auto_map", "model_type")}
        try:
            config = AutoConfig.for_model("qwen3", **fields)
        except Exception as e:  # a config transformers cannot read as Qwen3's
            raise DraftTreeError(f"{where}: its config is not a Qwen3 config ({str(e).splitlines()[0]})") from None
        config._attn_implementation = "sdpa"
        self.config = config
        ids = _value(cfg, "target_layer_ids")
        tcfg = target_model.config.get_text_config()
        layers = _layer_total(target_model)
        problems = []
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            raise DraftTreeError(f"{where}: dflash_config.target_layer_ids must list layer numbers, got {ids!r}")
        if any(not 0 <= i < layers - 1 for i in ids):
            problems.append(f"target layers {ids} out of range for a target of {layers} layers (it reads the outputs "
                            f"of layers 0..{layers - 2})")
        if config.hidden_size != tcfg.hidden_size:
            problems.append(f"hidden size {config.hidden_size} vs target {tcfg.hidden_size}")
        rows = target_model.get_input_embeddings().weight.shape[0]
        self.mask_token_id = _value(cfg, "mask_token_id")
        if not isinstance(self.mask_token_id, int) or not 0 <= self.mask_token_id < rows:
            problems.append(f"mask token {self.mask_token_id!r} outside the target's {rows} embedding rows")
        self.block_size = _value(cfg, "block_size", 16)
        if not isinstance(self.block_size, int) or self.block_size < 2:
            problems.append(f"block size {self.block_size!r} (at least 2: the root and one token to draft)")
        if problems:
            raise DraftTreeError(f"{where} does not fit its target: " + "; ".join(problems))
        self.target_layer_ids = list(ids)
        self.aux_layers = [i + 1 for i in ids]  # the target exposes layer inputs: the output of layer i enters i + 1
        h = config.hidden_size
        self.fc = nn.Linear(len(ids) * h, h, bias=False)
        self.hidden_norm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self._rotary = [Qwen3RotaryEmbedding(config)]  # unregistered: its float32 frequencies stay float32
        types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        causal = cfg.get("is_causal")
        self.windows = [config.sliding_window if t == "sliding_attention" else None for t in types]
        self.causal = [t == "sliding_attention" if causal is None else bool(causal) for t in types]
        self.input_scale = float(_value(cfg, "input_embedding_scale", 1.0))
        self.output_multiplier = float(_value(cfg, "output_multiplier", 1.0))
        softcap = _value(cfg, "final_logit_softcapping")
        self.softcap = float(softcap) if softcap else None
        self._embed = [target_model.get_input_embeddings()]  # frozen, the target's, never saved
        self._lm_head = [target_model.get_output_embeddings()]
        self.target_params = sum(p.numel() for p in target_model.parameters())

    def level_cost(self) -> float:
        """One drafter forward in target forwards: the bytes it reads (its layers and the target's LM head) over the
        target's. It drafts every depth of its block at once, so this is a round's cost, not a level's."""
        own = sum(p.numel() for p in self.parameters()) + self._lm_head[0].weight.numel()
        return own / max(1, self.target_params)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's raw embedding rows (a scaled embedding module's scale is not DFlash's: its own applies)."""
        return F.embedding(ids, self._embed[0].weight).to(self.fc.weight.dtype) * self.input_scale

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self._lm_head[0](hidden.to(self._lm_head[0].weight.dtype)) * self.output_multiplier
        return out if self.softcap is None else torch.tanh(out / self.softcap) * self.softcap

    def context(self, feats: torch.Tensor) -> torch.Tensor:
        """The target's concatenated features [c, k*H] as the drafter's context states [c, H]."""
        return self.hidden_norm(self.fc(feats.to(self.fc.weight.dtype)))

    @torch.inference_mode()
    def block(self, ctx: torch.Tensor, ids: torch.Tensor, start: int,
              past: list[tuple[torch.Tensor, torch.Tensor]] | None) -> tuple[torch.Tensor, list]:
        """One drafter forward: context states ``ctx`` [c, H] at positions ``start``.. and the block ``ids`` [b] right
        after them, attending to ``past`` (per layer the cached context keys and values [kv heads, start, dim]).
        Returns the block's normed output [b, H] and per layer the new context keys and values to cache."""
        c, b = ctx.shape[0], ids.numel()
        dev = ctx.device
        x = self.embed(ids.to(dev))
        pos = torch.arange(start, start + c + b, device=dev)
        rotary = self._rotary[0]
        if rotary.inv_freq.device != dev:
            rotary.to(dev)
        cos, sin = rotary(x[None], pos[None])
        cos, sin = cos[0].to(x.dtype)[None], sin[0].to(x.dtype)[None]  # [1, c + b, dim]: broadcast over heads
        new = []
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            d = attn.head_dim
            hx = layer.input_layernorm(x)
            q = attn.q_norm(attn.q_proj(hx).view(b, -1, d)).transpose(0, 1)
            kv_in = torch.cat([ctx, hx])
            k = attn.k_norm(attn.k_proj(kv_in).view(c + b, -1, d)).transpose(0, 1)
            v = attn.v_proj(kv_in).view(c + b, -1, d).transpose(0, 1)
            q, k = _rotate(q, cos[:, c:], sin[:, c:]), _rotate(k, cos, sin)
            new.append((k[:, :c], v[:, :c]))
            if past is not None and past[i][0].shape[1]:
                k, v = torch.cat([past[i][0], k], dim=1), torch.cat([past[i][1], v], dim=1)
            mask = self._mask(i, start + c, k.shape[1], b, dev)
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=attn.scaling,
                                                 enable_gqa=q.shape[0] != k.shape[0])[0]
            x = x + attn.o_proj(out.transpose(0, 1).reshape(b, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x), new

    def _mask(self, layer: int, first_query: int, keys: int, b: int, dev) -> torch.Tensor | None:
        """None (every key) unless the layer is causal or sliding, as the published code masks it: key index is
        position (the cache holds positions 0.. in order)."""
        window, causal = self.windows[layer], self.causal[layer]
        if window is None and not causal:
            return None
        qp = torch.arange(first_query, first_query + b, device=dev)[:, None]
        kp = torch.arange(keys, device=dev)[None, :]
        seen = torch.ones(b, keys, dtype=torch.bool, device=dev)
        if causal:
            seen &= kp <= qp
        if window is not None:
            seen &= qp - kp < window
            if not causal:
                seen &= kp - qp < window
        return seen[None, None]


def _layer_total(model: nn.Module) -> int:
    from drafttree.target import layer_count

    return layer_count(model)


def load_dflash(path: str | Path, cfg: dict, state: dict[str, torch.Tensor], target) -> DFlashHead:
    """A DFlash checkpoint (``cfg``, its tensors ``state``) for ``target`` (a LoadedModel); a misfit is one line."""
    where = f"DFlash drafter {path}"
    arch = " ".join(cfg.get("architectures") or [])
    if "DFlash2" in arch or "candidate_selector.hidden_projection.weight" in state:
        raise DraftTreeError(f"{where} is a DFlash2 drafter (causal convolutions and a candidate selector): only "
                             f"DFlash ({ARCHITECTURE}) drafters load")
    head = DFlashHead(cfg, target.model, where)
    state = {k.removeprefix("model."): v for k, v in state.items()}
    try:
        missing, unexpected = head.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a tensor of another shape
        raise DraftTreeError(f"{where}: weights do not match the architecture ({str(e).splitlines()[-1].strip()})") \
            from None
    if missing or unexpected:
        raise DraftTreeError(f"{where}: weights do not match the architecture (missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]})")
    head.layout = "dflash"
    head.meta = {}
    return head
