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
mlp.{gate,up,down}_proj}`` (Qwen3 decoder layers: their modules hold the weights here, this file runs them).

DFlash2 (``DFlash2DraftModel``; ``conv_kernel_size``, ``conv_group_size``, ``selector_rank``, ``selector_top_k`` in
``dflash_config``) adds a grouped dynamic causal convolution over the block's positions before and after each layer's
attention and MLP (``layers.<i>.{attention,mlp}_conv.{base_kernel, kernel_projection.weight}``), and a candidate
selector: each depth's ``selector_top_k`` likeliest tokens are rescored by a low-rank term between the token chosen
above (the predecessor) and each candidate (``candidate_selector.{predecessor,successor}_codebook``, read with or
without a ``.weight`` suffix, and ``hidden_projection``), so its drafts depend on the path above them.

Also read: transformers' layout of the same drafter (``model_type: muse_glimmer_assistant``: ``encoder.fc``,
``encoder.output_norm_enc``, settings at the top level; bidirectional attention, windowed in sliding layers), and older
checkpoints without ``target_layer_ids`` (z-lab's default layers). vLLM's own DFlash extensions (``causal``,
``use_swa``, ``swa_window_size``, ``midlayer.`` names) are read as vLLM reads them; attention sinks and a learnt mask
embedding are refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from drafttree.errors import DraftTreeError
from drafttree.target import layer_count

MUSE = "muse_glimmer_assistant"  # a DFlash drafter in transformers' layout (``encoder.fc``, ...)
# vLLM's DFlash extensions, which z-lab's code does not have: refused rather than silently drafted without
VLLM_ONLY = ("attention_sink_bias", "add_swa_attention_sink_bias")


def is_dflash(cfg: dict) -> bool:
    """Whether a head directory's config describes a DFlash drafter (either generation, or transformers' layout)."""
    arch = " ".join(cfg.get("architectures") or [])
    return "DFlash" in arch or "dflash_config" in cfg or cfg.get("model_type") == MUSE or "MuseGlimmerAssistant" in arch


def default_layer_ids(target_layers: int, draft_layers: int) -> list[int]:
    """The layers older DFlash checkpoints leave implicit (z-lab's rule): the middle one for a one-layer drafter, else
    evenly spaced from layer 1 to layer L - 3."""
    if draft_layers == 1:
        return [target_layers // 2]
    span = target_layers - 4
    return [int(round(1 + i * span / (draft_layers - 1))) for i in range(draft_layers)]


def _value(cfg: dict, name: str, default=None):
    """A DFlash setting: ``dflash_config`` first (newer checkpoints), then the top level (older ones)."""
    inner = cfg.get("dflash_config") or {}
    return inner.get(name, cfg.get(name, default))


class CausalGroupConv(nn.Module):
    """DFlash2's grouped dynamic causal convolution along the block: output at position t sums, over offsets o < K, the
    input at t - o times (a learnt kernel + a kernel computed from the input at t), per channel group."""

    def __init__(self, hidden: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel_size * (hidden // group_size), bias=False)

    def _conv(self, x: torch.Tensor, dyn: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        t, h = x.shape
        groups = h // self.group_size
        blocks = x.view(t, groups, self.group_size)
        out = torch.zeros_like(blocks)
        for o in range(self.kernel_size):
            shifted = blocks if o == 0 else F.pad(blocks[:-o], (0, 0, 0, 0, o, 0))
            out = out + base[o].view(groups, self.group_size).to(x.dtype) * shifted
            out = torch.addcmul(out, dyn[:, o, :, None], shifted)
        return out.view(t, h)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The input convolved with the first kernel, and the second kernel's dynamic part for :meth:`finish`."""
        dyn = self.kernel_projection(x).view(x.shape[0], 2, self.kernel_size, -1)
        return self._conv(x, dyn[:, 0], self.base_kernel[0]), dyn[:, 1]

    def finish(self, x: torch.Tensor, dyn: torch.Tensor) -> torch.Tensor:
        return self._conv(x, dyn, self.base_kernel[1])


class CandidateSelector(nn.Module):
    """DFlash2's rescoring of each depth's top candidates by their predecessor (the token drafted above)."""

    def __init__(self, vocab: int, hidden: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab, rank)
        self.successor_codebook = nn.Embedding(vocab, rank)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def scores(self, unary: torch.Tensor, cands: torch.Tensor, proj: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """One depth's candidate scores [m, k] after the ``m`` predecessors ``prev`` (``unary``, ``cands`` [k] and
        ``proj`` [rank] are the depth's)."""
        pair = (self.predecessor_codebook(prev) * proj[None]) @ self.successor_codebook(cands).T
        return unary[None] + pair


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

        unsupported = [k for k in VLLM_ONLY if cfg.get(k) or (cfg.get("dflash_config") or {}).get(k)]
        if unsupported:
            raise DraftTreeError(f"{where} uses vLLM's DFlash extensions ({', '.join(unsupported)}), which z-lab's "
                                 "published drafters do not: not supported")
        fields = {k: v for k, v in cfg.items() if k not in ("architectures", "auto_map", "model_type")}
        if cfg.get("model_type") == MUSE:  # transformers' DFlash assistant: bidirectional, windowed where sliding
            fields |= {"is_causal": False, "use_sliding_window": True}
            cfg = {**cfg, "is_causal": False}
        try:
            config = AutoConfig.for_model("qwen3", **fields)
        except Exception as e:  # a config transformers cannot read as Qwen3's
            raise DraftTreeError(f"{where}: its config is not a Qwen3 config ({str(e).splitlines()[0]})") from None
        config._attn_implementation = "sdpa"
        self.config = config
        tcfg = target_model.config.get_text_config()
        layers = layer_count(target_model)
        ids = _value(cfg, "target_layer_ids")
        if ids is None and "dflash_config" in cfg:  # older checkpoints: z-lab's default for the target's depth
            ids = default_layer_ids(int(cfg.get("num_target_layers") or layers), config.num_hidden_layers)
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
        if isinstance(self.block_size, float) and self.block_size.is_integer():
            self.block_size = int(self.block_size)
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
        dc = cfg.get("dflash_config") or {}
        causal = cfg.get("is_causal", dc.get("causal"))  # dflash_config.causal: vLLM's override for every layer
        self.windows = [config.sliding_window if t == "sliding_attention" else None for t in types]
        if dc.get("use_swa") and not any(t == "sliding_attention" for t in cfg.get("layer_types") or []):
            # vLLM's use_swa (MiMo's drafters): every layer windowed, non-causal unless said otherwise
            window = dc.get("swa_window_size", cfg.get("sliding_window"))
            if not isinstance(window, int) or window < 1:
                raise DraftTreeError(f"{where}: use_swa needs a window (swa_window_size or sliding_window)")
            self.windows = [window] * config.num_hidden_layers
            types = ["full_attention"] * config.num_hidden_layers  # causal only if said
        # z-lab's windows keep keys less than the window away; transformers' bidirectional ones (its layout's) keep
        # keys up to the window away, inclusive
        self.inclusive = cfg.get("model_type") == MUSE
        self.causal = [t == "sliding_attention" if causal is None else bool(causal) for t in types]
        self.input_scale = float(_value(cfg, "input_embedding_scale", 1.0))
        self.output_multiplier = float(_value(cfg, "output_multiplier", 1.0))
        softcap = _value(cfg, "final_logit_softcapping")
        self.softcap = float(softcap) if softcap is not None and float(softcap) > 0 else None
        self.selector = None
        if "DFlash2" in " ".join(cfg.get("architectures") or []) or _value(cfg, "selector_rank") is not None:
            self._dflash2(cfg, config, where)
        self._embed = [target_model.get_input_embeddings()]  # frozen, the target's, never saved
        self._lm_head = [target_model.get_output_embeddings()]
        self.target_params = sum(p.numel() for p in target_model.parameters())

    def _dflash2(self, cfg: dict, config, where: str) -> None:
        names = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
        values = {n: _value(cfg, n) for n in names}
        bad = [n for n, v in values.items() if not isinstance(v, int) or v < 1]
        h = config.hidden_size
        if bad or h % values["conv_group_size"]:
            raise DraftTreeError(f"{where}: a DFlash2 config needs positive integers {', '.join(names)} "
                                 f"(conv_group_size dividing the hidden size {h}); got {values}")
        for layer in self.layers:
            layer.attention_conv = CausalGroupConv(h, values["conv_kernel_size"], values["conv_group_size"])
            layer.mlp_conv = CausalGroupConv(h, values["conv_kernel_size"], values["conv_group_size"])
        self.selector = CandidateSelector(config.vocab_size, h, values["selector_rank"], values["selector_top_k"])

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
            convs = getattr(layer, "attention_conv", None) is not None  # DFlash2
            if convs:
                hx, second = layer.attention_conv.prepare(hx)
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
            a = attn.o_proj(out.transpose(0, 1).reshape(b, -1))
            x = x + (layer.attention_conv.finish(a, second) if convs else a)
            m = layer.post_attention_layernorm(x)
            if convs:
                m, second = layer.mlp_conv.prepare(m)
                x = x + layer.mlp_conv.finish(layer.mlp(m), second)
            else:
                x = x + layer.mlp(m)
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
            window += int(self.inclusive)
            seen &= qp - kp < window
            if not causal:
                seen &= kp - qp < window
        return seen[None, None]


def load_dflash(path: str | Path, cfg: dict, state: dict[str, torch.Tensor], target) -> DFlashHead:
    """A DFlash checkpoint (``cfg``, its tensors ``state``) for ``target`` (a LoadedModel); a misfit is one line."""
    where = f"DFlash drafter {path}"
    if (Path(path) / "mask_embedding.pt").exists():
        raise DraftTreeError(f"{where} carries a learnt mask embedding (mask_embedding.pt, vLLM's DFlash extension), "
                             "which z-lab's published drafters do not: not supported")
    head = DFlashHead(cfg, target.model, where)
    state = {k.removeprefix("model."): v for k, v in state.items()}
    # transformers' assistant layout, and vLLM's name for a one-layer drafter's layer
    renames = {"encoder.fc.": "fc.", "encoder.output_norm_enc.": "hidden_norm.", "midlayer.": "layers.0."}
    state = {next((new + k[len(old):] for old, new in renames.items() if k.startswith(old)), k): v
             for k, v in state.items()}
    for name in ("predecessor_codebook", "successor_codebook"):  # published without the ``.weight`` suffix
        key = f"candidate_selector.{name}"
        if key in state:
            state[f"{key}.weight"] = state.pop(key)
    state = {k.replace("candidate_selector.", "selector.", 1): v for k, v in state.items()}
    try:
        missing, unexpected = head.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a tensor of another shape
        raise DraftTreeError(f"{where}: weights do not match the architecture ({str(e).splitlines()[-1].strip()})") \
            from None
    if missing or unexpected:
        raise DraftTreeError(f"{where}: weights do not match the architecture (missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]})")
    head.layout = "dflash2" if head.selector is not None else ("muse" if cfg.get("model_type") == MUSE else "dflash")
    head.meta = {}
    return head
