"""Load a draft head from a directory, in whichever published layout it came in, without conversion.

Layouts (detected from ``config.json`` and the weight names):
  * drafttree / EAGLE-1/2 (EAGLE repo, ``yuhuili/EAGLE-*``): ``fc`` (2H -> H) + ``layers.0.*``; a stored
    ``embed_tokens.weight`` is the target's and is dropped.
  * EAGLE-3, EAGLE repo / SpecForge / SGLang: ``draft_vocab_size`` in the config, ``fc`` (3H -> H),
    ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``; aux layers from ``eagle_config.
    eagle_aux_hidden_state_layer_ids`` (SpecForge/SGLang count layer *outputs*: +1 gives the layer input)
    or a top-level ``eagle_aux_hidden_state_layer_ids`` (vLLM: layer inputs), else 2, L/2, L-3.
  * EAGLE-3, vLLM speculators: ``speculators_model_type: eagle3``, ``transformer_layer_config``,
    ``layers.0.*`` for ``midlayer.*``, top-level aux ids (layer inputs); ``norm_before_residual`` read as vLLM
    reads it (true when absent), ``norm_before_fc`` and ``norm_output`` honoured.
  * DFlash (z-lab's ``DFlashDraftModel``): ``dflash_config`` in the config; drafts a whole block per forward
    (heads/dflash.py).
Weights in ``model.safetensors`` (or its shards, listed by ``model.safetensors.index.json``) or ``pytorch_model.bin``
(``torch.load(weights_only=True)``: tensors only, never an arbitrary unpickle). A head that does not fit its target
gets a one-line error.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from safetensors.torch import load_file

from drafttree.errors import DraftTreeError
from drafttree.heads.assistant import is_assistant, load_assistant
from drafttree.heads.dflash import is_dflash, load_dflash
from drafttree.heads.eagle3 import Eagle3Head, default_aux_layers, layer_config_from
from drafttree.heads.eagle3_format import read_eagle3
from drafttree.heads.model import EagleHead
from drafttree.heads.mtp import find_mtp, load_mtp
from drafttree.kernels.memory import move_to_huge_pages
from drafttree.target import layer_count

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX = "model.safetensors.index.json"  # or shards listed there


def read_head_config(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise DraftTreeError(f"head not found: {path}")
    if not (path / "config.json").exists() or not any((path / f).exists() for f in WEIGHT_FILES + (INDEX,)):
        raise DraftTreeError(f"{path} is not a head directory (needs config.json and model.safetensors, its shards "
                             "with model.safetensors.index.json, or pytorch_model.bin)")
    try:
        return json.loads((path / "config.json").read_text())
    except json.JSONDecodeError:
        raise DraftTreeError(f"{path}/config.json is not valid JSON") from None


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    st, binary = path / "model.safetensors", path / "pytorch_model.bin"
    index = path / INDEX
    try:
        if st.exists():
            return load_file(str(st), device="cpu")
        if index.exists():  # a sharded head (a large drafter's weights in several files)
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return {k: v for f in files for k, v in load_file(str(path / f), device="cpu").items()}
        state = torch.load(binary, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise DraftTreeError(f"{binary} holds more than tensors; refusing to unpickle it ({e})") from None
    except Exception as e:
        where = st if st.exists() else index if index.exists() else binary
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DraftTreeError(f"{where} is unreadable ({first})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DraftTreeError(f"{binary} is not a state dict of tensors")
    return state


def head_layout(cfg: dict, keys) -> str:
    """'eagle1', 'eagle3' (EAGLE repo / SpecForge / SGLang) or 'speculators'."""
    if cfg.get("speculators_model_type") is not None:
        return "speculators"
    arch = " ".join(cfg.get("architectures") or [])
    if ("Eagle3" in arch or cfg.get("drafttree", {}).get("format") == "drafttree-eagle3"
            or any(k.startswith("midlayer.") for k in keys)):
        return "eagle3"
    return "eagle1"


def head_dir(path: str | Path) -> Path:
    """``path`` itself, or for a hub id (``org/name``) that is no local path, its snapshot in the Hugging Face cache
    (never fetched: download it first, e.g. ``hf download org/name``)."""
    p = Path(path)
    text = str(path)
    if p.exists() or text.count("/") != 1 or text.startswith((".", "/", "~")):
        return p
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(text, local_files_only=True))
    except Exception:  # not a valid id, or not in the cache
        raise DraftTreeError(f"head not found: {text} is neither a directory nor a hub model in the local Hugging "
                             f"Face cache (download it first: hf download {text})") from None


def load_head(path: str | Path, target, dtype: torch.dtype | None = None):
    """Load a head for ``target`` (a LoadedModel), refusing one that does not fit it; in the target's dtype
    unless ``dtype`` says otherwise (training continues a head in float32). ``path``: a directory or a cached hub id."""
    path = head_dir(path)
    if is_assistant(path):  # Gemma 4's drafters: a model of their own, read by transformers
        return load_assistant(path, target)
    if find_mtp(path) is not None:  # a model's own checkpoint with its MTP layer (DeepSeek, GLM, Qwen3-Next, MiMo)
        return _ready(load_mtp(path, target), path, target, dtype)
    cfg = read_head_config(path)
    state = read_weights(path)
    if is_dflash(cfg):  # z-lab's block drafters: the whole block in one forward
        return _ready(load_dflash(path, cfg, state, target), path, target, dtype)
    state = {k.removeprefix("model."): v for k, v in state.items()}  # vLLM-style prefixes
    layout = head_layout(cfg, state)
    if layout == "speculators" and cfg["speculators_model_type"] != "eagle3":  # e.g. an EAGLE-1 speculator
        raise DraftTreeError(f"{path}: speculators model type {cfg['speculators_model_type']!r} is not supported "
                             "(EAGLE-3 only)")
    head = _load_eagle1(path, cfg, state, target) if layout == "eagle1" else _load_eagle3(path, cfg, state, target,
                                                                                         layout)
    head.meta = cfg.get("drafttree", {})
    head.layout = layout
    return _ready(head, path, target, dtype)


def _ready(head, path, target, dtype: torch.dtype | None):
    """On the target's device, in its dtype (or ``dtype``), frozen, its weights on huge pages."""
    head.to(device=target.device, dtype=dtype or target.dtype).eval().requires_grad_(False)
    move_to_huge_pages(head)  # each draft level streams the head's weights, like a target forward (kernels/memory.py)
    head.path = Path(path)
    return head


def _misfit(path, cfg: dict, target, hidden, vocab, model_type=None) -> None:
    tcfg = target.model.config
    problems = []
    if hidden is not None and hidden != tcfg.hidden_size:
        problems.append(f"hidden size {hidden} vs target {tcfg.hidden_size}")
    if vocab is not None and vocab != target.vocab_size:
        problems.append(f"vocab size {vocab} vs target {target.vocab_size}")
    if model_type is not None and model_type != tcfg.model_type:
        problems.append(f"architecture {model_type} vs target {tcfg.model_type}")
    if problems:
        trained = cfg.get("drafttree", {}).get("target", {}).get("name") or "another model"
        raise DraftTreeError(f"head {path} was trained for {trained} and does not fit {target.name}: "
                             + "; ".join(problems))


def _draft_vocab(path, state: dict, rows: int, target) -> torch.Tensor | None:
    d2t = state.pop("d2t", None)
    state.pop("t2d", None)
    if d2t is None:
        if rows not in (None, target.vocab_size):
            raise DraftTreeError(f"head {path}: {rows} draft-vocabulary rows but no d2t mapping to target ids")
        return None
    ids = d2t.long() + torch.arange(d2t.numel())
    if rows is not None and ids.numel() != rows:
        raise DraftTreeError(f"head {path}: d2t has {ids.numel()} entries for {rows} draft-vocabulary rows")
    if int(ids.min()) < 0 or int(ids.max()) >= target.vocab_size:
        raise DraftTreeError(f"head {path}: d2t maps draft ids outside the target's vocabulary "
                             f"(0..{target.vocab_size - 1})")
    return ids


def _drop_embedding(path, state: dict, target) -> None:
    emb = state.pop("embed_tokens.weight", None)
    if emb is not None and tuple(emb.shape) != tuple(target.model.get_input_embeddings().weight.shape):
        raise DraftTreeError(f"head {path}: its embedding {tuple(emb.shape)} is not the target's "
                             f"{tuple(target.model.get_input_embeddings().weight.shape)}")


def _check_state(path, head, state: dict) -> None:
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DraftTreeError(f"head {path}: weights do not match the architecture "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")


def _load_eagle1(path, cfg: dict, state: dict, target) -> EagleHead:
    meta = cfg.get("drafttree", {})
    sig = meta.get("target", {})
    _misfit(path, cfg, target, cfg.get("hidden_size"), sig.get("vocab_size", cfg.get("vocab_size")),
            sig.get("model_type") if meta else None)
    _drop_embedding(path, state, target)
    draft_vocab = _draft_vocab(path, state, None, target)
    layers = meta.get("num_layers") or cfg.get("num_hidden_layers", 1)
    head = EagleHead(target.model, num_layers=int(layers), draft_vocab=draft_vocab, target_name=target.name,
                     fc_bias="fc.bias" in state, intermediate_size=cfg.get("intermediate_size"))
    try:
        _check_state(path, head, state)
    except RuntimeError as e:  # size mismatches
        raise DraftTreeError(f"head {path}: weights do not match the architecture ({str(e).splitlines()[-1]})") \
            from None
    return head


def _load_eagle3(path, cfg: dict, state: dict, target, layout: str) -> Eagle3Head:
    ck = read_eagle3(cfg, state, layout, where=f"head {path}")
    tcfg = target.model.config
    _misfit(path, cfg, target, ck.layer.get("hidden_size"), ck.layer.get("vocab_size"))
    state = dict(ck.state)
    _drop_embedding(path, state, target)
    rows = state["lm_head.weight"].shape[0] if "lm_head.weight" in state else None
    draft_vocab = _draft_vocab(path, state, rows, target)
    n = layer_count(target.model)
    aux = ck.aux_layers if ck.aux_layers is not None else default_aux_layers(n)
    if any(not isinstance(i, int) or not 0 <= i < n for i in aux):
        raise DraftTreeError(f"head {path}: aux hidden-state layers {aux} are out of range for {target.name} "
                             f"({n} layers)")
    fc = state.get("fc.weight")
    if fc is not None and fc.shape[1] != len(aux) * tcfg.hidden_size:
        raise DraftTreeError(f"head {path}: fc reads {fc.shape[1]} features, not {len(aux)} target layers of "
                             f"{tcfg.hidden_size}")
    head = Eagle3Head(target.model, layer_config_from(ck.layer), draft_vocab, aux, target.name, **ck.variants)
    try:
        _check_state(path, head, state)
    except RuntimeError as e:
        raise DraftTreeError(f"head {path}: weights do not match the architecture ({str(e).splitlines()[-1]})") \
            from None
    return head
