"""Multi-token-prediction (MTP) modules shipped inside a model's own checkpoint, drafting as they were trained to.

DeepSeek-V3/R1, GLM-4.5+, Qwen3-Next / Qwen3.5, MiMo, ERNIE 4.5, Mellum and LongCat-Flash checkpoints carry an extra
"next-n" layer after their decoder layers, trained with the model to predict the token after next; vLLM and SGLang
serve it as an EAGLE-style drafter. Transformers drops its weights on load, so they are read again from the checkpoint
(sharded or not, only the MTP tensors). The module is EAGLE-1's shape with norms around it:
``fc([emb_norm(emb(token t+1)); hidden_norm(feature t)])`` (2H -> H), one decoder layer **of the target's own class**
built at index L (so a DeepSeek MTP layer gets its MoE MLP), a final norm, and the target's LM head (or the
checkpoint's own copy where it differs). A later draft step feeds the layer's output back as the feature, as vLLM
does: unnormed for DeepSeek's and ERNIE's layouts, normed for the others; DeepSeek's, MiMo-7B's and ERNIE's zero the
embedding at position 0 as vLLM does. Where a checkpoint has several MTP layers (MiMo-V2-Flash: three), the first
drafts every step, as vLLM does.

Layouts (by their weight names):
  * ``model.layers.{L}.{enorm,hnorm,eh_proj,shared_head.norm,shared_head.head,<decoder layer>}`` (DeepSeek, GLM);
  * ``mtp.{pre_fc_norm_embedding,pre_fc_norm_hidden,fc,norm,layers.0.<decoder layer>}`` (Qwen3-Next, Qwen3.5,
    Mellum: its layer of the type the config's ``mtp_layer_types`` names, e.g. sliding-window attention with MoE);
  * ``model.mtp_layers.0.{token_layernorm,hidden_layernorm,input_proj,final_layernorm,<decoder layer>}`` (MiMo-7B:
    ``input_proj`` reads [hidden; embedding], the output normed and fed back, the embedding zeroed at position 0);
  * ``model.mtp_{emb_norm,hidden_norm,linear_proj}.0`` and ``model.mtp_block.0.<decoder layer>`` (ERNIE 4.5: a dense
    layer, the target's final norm before the LM head as transformers' ``MtpModel`` reads it, the unnormed output fed
    back and the embedding zeroed at position 0 as vLLM serves it);
  * ``model.mtp.layers.0.{enorm,hnorm,eh_proj,final_layernorm,<decoder layer>}`` (MiMo-V2-Flash: a sliding-window
    layer with attention sinks and a dense MLP, ``pre_mlp_layernorm`` and ``attention_sink_bias`` as published);
  * ``model.mtp.{layers.0.enorm.m,layers.0.hnorm.m,layers.0.eh_proj,norm,embed_tokens,layers.0.<layer>}``
    (LongCat-Flash: a plain layer, one MLA attention and one dense MLP, ``transformer_layer.mlp``, not the target's
    two-sublayer kind).
Transformers' ``MtpModel`` (5.25) builds the same computation for ERNIE and Mellum; the tests check against it.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from drafttree import kernels
from drafttree.cache import cache_arg
from drafttree.errors import DraftTreeError
from drafttree.heads.model import EagleHead, rotary_of
from drafttree.models import text_only
from drafttree.target import layer_count


@dataclass(frozen=True)
class MtpLayout:
    name: str
    prefix: str  # '{L}' stands for the target's layer count
    marker: str  # a weight only this layout has (relative to prefix)
    names: dict  # checkpoint name (relative to prefix) -> this module's; everything else is the decoder layer's
    block: str  # the decoder layer's prefix, relative to prefix
    normed_output: bool  # the fed-back feature is the final norm's output
    zero_first_embedding: bool
    hidden_first: bool = False  # fc reads [hidden; embedding] (MiMo) rather than [embedding; hidden]
    shared_norm: bool = False  # the output norm is the target's final norm, not in the MTP weights (ERNIE 4.5)
    dense: bool = False  # a dense MLP where the target's last layers are MoE: built as the target's layer 0 (ERNIE)
    kinds: tuple = ()  # (per-layer config list, the MTP layer's entry): what it is where the config does not say
    renames: tuple = ()  # (published, transformers') names inside the decoder layer
    plain: bool = False  # one attention and one dense MLP of the target's classes, not its decoder layer (LongCat)


LAYOUTS = (
    MtpLayout("deepseek", "model.layers.{L}.", "eh_proj.weight",
              {"enorm": "emb_norm", "hnorm": "hidden_norm", "eh_proj": "fc", "shared_head.norm": "norm",
               "shared_head.head": "own_head", "embed_tokens": "embedding"}, "", False, True),
    MtpLayout("qwen3_next", "mtp.", "fc.weight",
              {"pre_fc_norm_embedding": "emb_norm", "pre_fc_norm_hidden": "hidden_norm", "fc": "fc", "norm": "norm"},
              "layers.0.", True, False),
    MtpLayout("mimo", "model.mtp_layers.0.", "input_proj.weight",
              {"token_layernorm": "emb_norm", "hidden_layernorm": "hidden_norm", "input_proj": "fc",
               "final_layernorm": "norm"}, "", True, True, hidden_first=True),
    MtpLayout("mimo_v2", "model.mtp.layers.0.", "final_layernorm.weight",
              {"enorm": "emb_norm", "hnorm": "hidden_norm", "eh_proj": "fc", "final_layernorm": "norm"}, "", True,
              False, kinds=(("layer_types", "sliding_attention"), ("mlp_layer_types", "dense")),
              renames=(("pre_mlp_layernorm", "post_attention_layernorm"), ("attention_sink_bias", "sinks"))),
    MtpLayout("longcat", "model.mtp.", "layers.0.enorm.m.weight",
              {"layers.0.enorm.m": "emb_norm", "layers.0.hnorm.m": "hidden_norm", "layers.0.eh_proj": "fc",
               "norm": "norm", "embed_tokens": "embedding"}, "layers.0.", True, False,
              renames=(("transformer_layer.mlp.", "mlp."),), plain=True),
    MtpLayout("ernie", "model.mtp_", "linear_proj.0.weight",
              {"emb_norm.0": "emb_norm", "hidden_norm.0": "hidden_norm", "linear_proj.0": "fc"}, "block.0.",
              False, True, shared_norm=True, dense=True),
)


def _checkpoint_keys(path: Path) -> dict[str, Path]:
    """Every tensor name in a checkpoint directory -> the file holding it (safetensors, sharded or not)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            return {str(k): path / str(f) for k, f in weight_map.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise DraftTreeError(f"{index} is not a safetensors index (no weight_map of names to files)") from None
    single = path / "model.safetensors"
    if single.exists():
        try:
            with safe_open(str(single), framework="pt") as f:
                return dict.fromkeys(f.keys(), single)
        except Exception:  # unreadable: not an MTP checkpoint (the head loader says what is wrong with it)
            return {}
    return {}


def find_mtp(path: str | Path) -> tuple[MtpLayout, str, dict[str, Path]] | None:
    """(layout, prefix, the module's tensor names -> files) of the first MTP layer in the checkpoint at ``path``."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        return None
    try:
        cfg = json.loads(cfg_file.read_text())
        cfg = cfg.get("text_config") or cfg  # multimodal wrappers (Qwen3.5) keep the layer count in their text config
        cfg.get("num_hidden_layers")
    except (ValueError, AttributeError):
        return None
    keys = _checkpoint_keys(path)
    for layout in LAYOUTS:
        prefix = layout.prefix.format(L=cfg.get("num_hidden_layers", -1))
        if prefix + layout.marker in keys:
            return layout, prefix, {k: f for k, f in keys.items() if k.startswith(prefix)}
    return None


def _read(files: dict[str, Path]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(set(files.values())):
        try:
            with safe_open(str(file), framework="pt") as f:
                for k in (k for k, where in files.items() if where == file):
                    out[k] = f.get_tensor(k)
        except Exception as e:  # a missing shard or a truncated file: one line
            raise DraftTreeError(f"could not read the MTP weights in {file}: {type(e).__name__}: {e}") from None
    return out


def _block_size(path: Path) -> tuple[int, int]:
    """The FP8 quantization blocks of a checkpoint (``quantization_config.weight_block_size``; DeepSeek's 128 x 128)."""
    try:
        block = json.loads((path / "config.json").read_text()).get("quantization_config", {}).get("weight_block_size")
        return (int(block[0]), int(block[1])) if block else (128, 128)
    except (ValueError, AttributeError, TypeError, IndexError):
        return (128, 128)


def _dequantize_blocks(raw: dict[str, torch.Tensor], block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """FP8 weights with block-wise ``weight_scale_inv`` (DeepSeek-V3/R1's published checkpoints) back to bfloat16:
    each [block] tile of the weight times its scale, as DeepSeek's and transformers' dequantization do."""
    out = dict(raw)
    for name in [k for k in raw if k.endswith(".weight_scale_inv")]:
        weight = name.removesuffix("_scale_inv")
        w, scale = out.get(weight), out.pop(name).float()
        if w is None or w.dim() != 2 or scale.dim() != 2 or scale.shape[0] * block[0] < w.shape[0] or \
                scale.shape[1] * block[1] < w.shape[1]:
            raise DraftTreeError(f"MTP layer: {name} {tuple(scale.shape)} does not scale {weight} in {block} blocks")
        tiles = scale.repeat_interleave(block[0], 0)[:w.shape[0]].repeat_interleave(block[1], 1)[:, :w.shape[1]]
        out[weight] = (w.float() * tiles).to(torch.bfloat16)
    return out


def _layer_at(target_model: nn.Module, index: int, layout: MtpLayout):
    """The target's decoder-layer class built at ``index`` (past its last layer: MoE where the model puts MoE; at 0 for
    a ``dense`` layer) and the config it reads, per-layer lists extended by the config's ``mtp_<name>`` entry where it
    has one (Mellum's ``mtp_layer_types``), else the layout's (MiMo-V2-Flash's sliding dense layer), else full attention
    / the last entry; its cache slot is renumbered 0; eager attention kept where the target needs it (sinks)."""
    cfg = copy.deepcopy(target_model.config)
    n = cfg.num_hidden_layers
    cfg.num_hidden_layers = index + 1
    kinds = dict(layout.kinds)
    for name, value in list(vars(cfg).items()):
        if isinstance(value, list) and len(value) == n and n and not name.startswith("mtp_"):
            own = getattr(cfg, f"mtp_{name}", None)
            setattr(cfg, name, value + [own[0] if isinstance(own, list) and own else kinds.get(name) or (
                "full_attention" if name == "layer_types" else value[-1])])
    cfg._attn_implementation = "eager" if cfg._attn_implementation == "eager" else "sdpa"
    like = target_model.base_model.layers[0]
    layer = PlainLayer(cfg, like) if layout.plain else type(like)(cfg, 0 if layout.dense else index)
    for m in layer.modules():
        if hasattr(m, "layer_idx"):
            m.layer_idx = 0
    return layer, cfg


class PlainLayer(nn.Module):
    """A pre-norm decoder layer of one attention and one dense MLP, of the target layer's own classes: LongCat-Flash's
    MTP layer (its decoder layers have two attention sublayers and a shortcut MoE; the MTP layer is the plain kind)."""

    def __init__(self, config, like: nn.Module):
        super().__init__()
        attn, mlp, norm = (m[0] if isinstance(m, nn.ModuleList) else m for m in (
            like.self_attn, getattr(like, "mlps", None) or like.mlp, like.input_layernorm))
        self.self_attn = type(attn)(config, 0)
        self.mlp = type(mlp)(config)
        self.input_layernorm, self.post_attention_layernorm = (type(norm)(config.hidden_size, eps=config.rms_norm_eps)
                                                               for _ in range(2))

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, position_ids=None, cache=None,
                use_cache: bool = False, position_embeddings=None, **kwargs) -> torch.Tensor:
        h, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), attention_mask=attention_mask,
                              position_ids=position_ids, use_cache=use_cache, position_embeddings=position_embeddings,
                              **{cache_arg(self.self_attn): cache}, **kwargs)
        hidden_states = hidden_states + h
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


def _stack_experts(state: dict[str, torch.Tensor], params: set[str]) -> dict[str, torch.Tensor]:
    """Published per-expert tensors (``...experts.<i>.{gate,up,down}_proj.weight``) stacked the way transformers 5 keeps
    them (``experts.gate_up_proj`` [E, 2I, H]: gate then up; ``experts.down_proj`` [E, H, I]) where the layer does."""
    groups: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    rest = {}
    for k, v in state.items():
        m = _EXPERT.fullmatch(k)
        if m and f"{m[1]}.experts.gate_up_proj" in params:
            groups.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = state[k]
        else:
            rest[k] = v
    for prefix, experts in groups.items():
        order = [experts[i] for i in sorted(experts)]
        if sorted(experts) != list(range(len(experts))) or any(len(e) != 3 for e in order):
            raise DraftTreeError(f"MTP layer: experts under {prefix} are incomplete (each needs gate, up and down)")
        rest[f"{prefix}.experts.gate_up_proj"] = torch.stack([torch.cat([e["gate_proj"], e["up_proj"]]) for e in order])
        rest[f"{prefix}.experts.down_proj"] = torch.stack([e["down_proj"] for e in order])
    return rest


_EXPERT = re.compile(r"(.+)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


class MtpHead(EagleHead):
    """A checkpoint's own MTP layer as a draft head (the EAGLE drafters step it like an EAGLE-1 head)."""

    kind = "eagle"

    def __init__(self, target_model: nn.Module, layout: MtpLayout, target_name: str = "", own_head: bool = False,
                 own_embedding: bool = False, fc_bias: bool = False):
        nn.Module.__init__(self)
        target_model = text_only(target_model)
        base = target_model.base_model
        norm = getattr(base, "norm", None)
        if not isinstance(getattr(base, "layers", None), nn.ModuleList) or norm is None or not hasattr(base,
                                                                                                     "rotary_emb"):
            raise DraftTreeError(f"an MTP layer is built from its target's decoder layer, final norm and rotary "
                                 f"embedding; {type(base).__name__} lacks one of `layers`, `norm`, `rotary_emb`")
        self.mtp_layout = layout
        self.target_config = target_model.config
        self.target_name = target_name
        index = layer_count(target_model)
        layer, self.config = _layer_at(target_model, index, layout)
        self.layers = nn.ModuleList([layer])
        h = self.config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        self.emb_norm, self.hidden_norm, self.norm = (copy.deepcopy(norm) for _ in range(3))
        self._rotary, self._rotary_kw = rotary_of(target_model)
        types = getattr(self.config, "layer_types", None)
        self.layer_type = types[0 if layout.dense else index] if types else "full_attention"
        if self._rotary_kw:  # a table per layer type (Mellum's sliding layers rotate with their own theta)
            self._rotary_kw = {"layer_type": self.layer_type}
        # keys further back than the window are masked in drafting (drafters/eagle.py: EagleState.mask)
        self.sliding_window = getattr(self.config, "sliding_window", None) if self.layer_type == "sliding_attention" \
            else None
        self._embed = [base.get_input_embeddings()]
        self._lm_head = [target_model.get_output_embeddings()]
        lm = self._lm_head[0].weight
        self.own_head = nn.Linear(h, lm.shape[0], bias=False) if own_head else None
        self.own_embedding = nn.Embedding(*self._embed[0].weight.shape) if own_embedding else None
        self.target_params = sum(p.numel() for p in target_model.parameters())
        self.set_draft_vocab(None)

    @property
    def lm_head(self) -> nn.Module:
        return self.own_head if self.own_head is not None else self._lm_head[0]

    @property
    def embed_tokens(self) -> nn.Module:
        return self.own_embedding if self.own_embedding is not None else self._embed[0]

    def level_cost(self) -> float:
        """Bytes a draft level reads (the layer, norms, projection, LM head; an embedding's few rows not counted)."""
        head, emb = self.lm_head.weight, self.embed_tokens.weight
        own = sum(p.numel() for p in self.parameters() if p is not head and p is not emb) + head.numel()
        return own / max(1, self.target_params)

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        x = features if self.mtp_layout.normed_output else self.norm(features)
        return kernels.linear(x, self.draft_head_weight())

    def forward(self, features: torch.Tensor, next_ids: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, cache=None) -> torch.Tensor:
        dtype = self.fc.weight.dtype
        emb = self.embed_tokens(next_ids).to(dtype)
        if self.mtp_layout.zero_first_embedding:
            emb = emb.masked_fill((position_ids == 0)[..., None], 0.0)
        parts = [self.emb_norm(emb), self.hidden_norm(features.to(dtype))]
        h = self.fc(torch.cat(parts[::-1] if self.mtp_layout.hidden_first else parts, dim=-1))
        layer = self.layers[0]
        out = layer(h, attention_mask=attention_mask, position_ids=position_ids, use_cache=cache is not None,
                    position_embeddings=self._rotary[0](h, position_ids, **self._rotary_kw),
                    **{cache_arg(layer): cache})
        h = out[0] if isinstance(out, tuple) else out
        return self.norm(h) if self.mtp_layout.normed_output else h

    def save(self, path, dtype=None, extra=None) -> None:
        raise DraftTreeError("an MTP layer travels inside its model's checkpoint: there is no separate head to save")


def load_mtp(path: str | Path, target) -> MtpHead:
    """The first MTP layer of the checkpoint at ``path`` (the target's own directory) as a head for ``target``."""
    found = find_mtp(path)
    if found is None:
        raise DraftTreeError(f"{path} holds no multi-token-prediction layer (DeepSeek-style "
                             "model.layers.<L>.eh_proj, Qwen3-Next-style mtp.fc, MiMo-style "
                             "model.mtp_layers.0.input_proj, ERNIE-style model.mtp_linear_proj.0, MiMo-V2-style "
                             "model.mtp.layers.0.final_layernorm or LongCat-style model.mtp.layers.0.enorm.m weights)")
    layout, prefix, files = found
    raw = _dequantize_blocks(_read(files), _block_size(Path(path)))
    state: dict[str, torch.Tensor] = {}
    for k, v in raw.items():
        rel = k[len(prefix):]
        theirs = next((n for n in layout.names if rel.startswith(n + ".")), None)
        if theirs is not None:
            state[layout.names[theirs] + rel[len(theirs):]] = v
        elif rel.startswith(layout.block):  # the decoder layer's (Qwen3-Next's second MTP layer, if any, left out)
            rel = rel[len(layout.block):]
            for theirs_name, ours in layout.renames:
                rel = rel.replace(theirs_name, ours)
            state["layers.0." + rel] = v
    quantized = sorted(k for k in raw if k.endswith(("weight_scale_inv", "weight_scale", "input_scale")))
    quantized += sorted(f"{k} ({v.dtype})" for k, v in raw.items() if v.element_size() == 1)  # FP8 / int8 weights
    if quantized:
        raise DraftTreeError(f"the MTP layer in {path} is quantized ({quantized[0]}): drafttree reads MTP layers in "
                             "float32 / float16 / bfloat16, and FP8 with block-wise weight_scale_inv, only")
    own = {}
    for name, mine in (("own_head.weight", target.model.get_output_embeddings().weight),
                       ("embedding.weight", target.model.get_input_embeddings().weight)):
        theirs = state.get(name)
        if theirs is not None and tuple(theirs.shape) != tuple(mine.shape):
            raise DraftTreeError(f"MTP layer in {path}: its {name.split('.')[0].replace('_', ' ')} "
                                 f"{tuple(theirs.shape)} is not the target's {tuple(mine.shape)}")
        # a copy of the target's (DeepSeek's checkpoints repeat them) is shared, one that differs is the layer's own
        own[name] = theirs is not None and not torch.equal(theirs.to(mine.dtype), mine.detach().cpu())
        if theirs is not None and not own[name]:
            state.pop(name)
    if "embedding.weight" in state:
        state["own_embedding.weight"] = state.pop("embedding.weight")
    if layout.shared_norm:  # ERNIE: the target's final norm (shared, not copied)
        final = getattr(text_only(target.model).base_model, "norm", None)
        state |= {f"norm.{k}": v.detach() for k, v in (final.state_dict().items() if final is not None else ())}
    with torch.device("meta"):  # built without memory: the checkpoint's tensors become its parameters (assign)
        head = MtpHead(target.model, layout, target.name, own_head=own["own_head.weight"],
                       own_embedding=own["embedding.weight"], fc_bias="fc.bias" in state)
    state = _stack_experts(state, {n for n, _ in head.named_parameters()})
    try:
        missing, unexpected = head.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as e:  # size mismatches
        raise DraftTreeError(f"MTP layer in {path} does not fit {target.name} ({str(e).splitlines()[-1].strip()})") \
            from None
    left = [n for n, t in [*head.named_parameters(), *head.named_buffers()] if t.is_meta]
    if missing or unexpected or left:
        raise DraftTreeError(f"MTP layer in {path}: weights do not match {target.name}'s layer "
                             f"(missing {(missing or left)[:3]}, unexpected {unexpected[:3]})")
    try:  # a layer type the target's rotary embedding keeps no table for (its config names one its layers lack)
        head._rotary[0](head.fc.weight[:1], torch.zeros(1, 1, dtype=torch.long), **head._rotary_kw)
    except (AttributeError, KeyError, TypeError) as e:
        raise DraftTreeError(f"MTP layer in {path}: {target.name}'s rotary embedding has no table for the layer's "
                             f"{head.layer_type} ({type(e).__name__}: {e})") from None
    head.layout = f"mtp-{layout.name}"
    head.meta = {}
    return head
