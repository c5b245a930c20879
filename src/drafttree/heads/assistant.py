"""Gemma 4's assistant models (``gemma4_assistant``: Google's drafters published beside Gemma 4), loaded as they are.

An assistant is not an EAGLE head: it keeps no cache of its own. A draft step reads the token's embedding (the
target's own embedding table) beside a hidden state (the target's last hidden state for the root, then the step's own
projected output), projects them to its width, and runs its few decoder layers with every layer attending to the
*target's* keys and values (those of the target's last full-attention and last sliding-window layer before its shared
layers), all at the root's position. So each tree node's step depends only on its parent's output: a level of the tree
is one forward with the level's nodes as a batch, against the target's committed keys (``AssistantHead.step``).
Transformers' ``SinglePositionMultiTokenCandidateGenerator`` drafts the same chain (tests/test_assistant.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from drafttree.errors import DraftTreeError

MODEL_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")


def is_assistant(path: str | Path) -> bool:
    """Whether ``path`` holds an assistant checkpoint (its config.json says so)."""
    cfg = Path(path) / "config.json"
    try:
        return json.loads(cfg.read_text()).get("model_type") in MODEL_TYPES
    except (OSError, ValueError):
        return False


def shared_kv_layers(config) -> dict[str, int]:
    """The target layer whose keys and values an assistant reads, per layer type: the last of that type before the
    target's KV-sharing layers (the layers transformers marks ``store``; the last of each type without sharing)."""
    types = getattr(config, "layer_types", None) or []
    first_shared = len(types) - int(getattr(config, "num_kv_shared_layers", 0) or 0)
    return {t: max(i for i in range(first_shared) if types[i] == t) for t in set(types[:first_shared])}


def _streamed_params(model: nn.Module) -> int:
    """Parameters a forward reads whole: all but lookup tables (Gemma 4's per-layer embeddings are most of an E2B's
    parameters, a few rows of them read per token), the output embedding counted even where tied to the input's."""
    out = model.get_output_embeddings()
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)} - {id(getattr(out, "weight", 0))}
    return sum(p.numel() for p in model.parameters() if id(p) not in lookups)


def _key_shape_misfits(assistant: nn.Module, target_model: nn.Module, kv_layers: dict[str, int]) -> list[str]:
    """Each assistant layer's key width and head count against the target layer it reads (Gemma 4 attention)."""
    types = assistant.config.get_text_config().layer_types
    problems = []
    for i, layer in enumerate(assistant.model.layers):
        mine = layer.self_attn
        theirs = target_model.base_model.layers[kv_layers[types[i]]].self_attn
        want = (getattr(theirs, "head_dim", None), getattr(getattr(theirs, "k_proj", None), "out_features", None))
        if None in want or mine.head_dim != want[0] or mine.config.num_attention_heads % (want[1] // want[0]):
            problems.append(f"layer {i} ({types[i]}) reads keys {want[0]} wide in {want[1] // (want[0] or 1)} heads "
                            f"from target layer {kv_layers[types[i]]}, not {mine.head_dim} wide")
            break
    return problems


class AssistantHead(nn.Module):
    """A Gemma 4 assistant drafting for ``target_model`` (drafters/assistant.py steps it through a tree)."""

    kind = "assistant"
    draft_vocab = None  # drafts over the whole vocabulary

    def __init__(self, assistant: nn.Module, target_model: nn.Module, where: str = "assistant"):
        super().__init__()
        cfg, tcfg = assistant.config, target_model.config.get_text_config()
        text = cfg.get_text_config()
        problems = []
        if cfg.backbone_hidden_size != tcfg.hidden_size:
            problems.append(f"backbone hidden size {cfg.backbone_hidden_size} vs target {tcfg.hidden_size}")
        if text.vocab_size != target_model.get_input_embeddings().weight.shape[0]:
            problems.append(f"vocab size {text.vocab_size} vs target "
                            f"{target_model.get_input_embeddings().weight.shape[0]}")
        self.kv_layers = shared_kv_layers(tcfg)
        missing = sorted(set(text.layer_types) - set(self.kv_layers))
        if missing:
            problems.append(f"its layers attend to the target's {' and '.join(missing)} layers' keys, which the "
                            f"target ({tcfg.model_type}) does not have")
        else:
            problems += _key_shape_misfits(assistant, target_model, self.kv_layers)
        if problems:
            raise DraftTreeError(f"{where} does not fit its target: " + "; ".join(problems))
        self.assistant = assistant
        self.embed = target_model.get_input_embeddings()  # the target's (Gemma's scaled) embedding table
        self.target_params = _streamed_params(target_model)
        self.window = int(getattr(text, "sliding_window", None) or 0)

    @property
    def fc(self) -> nn.Linear:  # where the drafters look for the head's device and dtype
        return self.assistant.pre_projection

    def level_cost(self) -> float:
        """One draft level's cost in target forwards: the bytes it reads over the target's (a model, as for heads)."""
        return _streamed_params(self.assistant) / max(1, self.target_params)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, position: int,
             kv: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits [n, V] and projected states [n, H] for ``n`` nodes (``tokens`` [n] after ``hidden`` [n, H])
        at sequence ``position``, attending to the target's keys and values ``kv`` ([1, heads, T, dim] per type)."""
        a = self.assistant
        if not kv:
            raise DraftTreeError("a Gemma 4 assistant drafts from its target's keys and values: none were attached")
        n = tokens.numel()
        emb = torch.cat([self.embed(tokens.reshape(n, 1)), hidden.reshape(n, 1, -1).to(self.fc.weight.dtype)], -1)
        x = a.pre_projection(emb)
        shared = {t: (k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for t, (k, v) in kv.items()}
        length = next(iter(kv.values()))[0].shape[-2]
        mask = torch.ones(n, length, dtype=torch.long, device=x.device)  # every committed key: the model's own masks
        masks = a.create_attention_masks(x, mask, shared)
        pos = torch.full((n, 1), position, dtype=torch.long, device=x.device)
        out = a.model(inputs_embeds=x, attention_mask=masks, position_ids=pos, shared_kv_states=shared,
                      use_cache=False).last_hidden_state
        if a.masked_embedding is not None:  # a node's masked logits are its own (the fill is a minimum over the batch)
            logits = torch.cat([a.masked_embedding(out[i:i + 1], a.lm_head.weight) for i in range(n)])
        else:
            logits = a.lm_head(out)
        return logits[:, -1], a.post_projection(out)[:, -1]


def load_assistant(path: str | Path, target) -> AssistantHead:
    """An assistant checkpoint directory for ``target`` (a LoadedModel), refused in one line where it does not fit."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=target.dtype)
    except Exception as e:  # a missing file, an unknown layout, a truncated tensor: whatever transformers raises
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DraftTreeError(f"could not load the assistant {path}: {first}") from None
    head = AssistantHead(model.to(target.device).eval().requires_grad_(False), target.model, f"assistant {path}")
    head.path = Path(path)
    head.layout = "gemma4_assistant"
    head.meta = {}
    return head
