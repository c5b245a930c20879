"""Export a head for serving engines: SGLang, vLLM, the EAGLE repo, vLLM's speculators.

EAGLE-3 heads (any layout :mod:`drafttree.heads.loading` reads) are rewritten by
:func:`drafttree.heads.eagle3_format.write_eagle3` in the layout each reader loads, aux layer ids in its
convention. EAGLE-1/2 heads: all three EAGLE-1 readers take EAGLE-1's layout: ``fc`` (2H -> H) +
``layers.0.*`` (a Llama decoder layer without ``input_layernorm``), the target's embeddings and LM head
reused at run time. What differs is the config:
  * sglang: ``architectures: ["LlamaForCausalLMEagle"]`` (``--speculative-algorithm EAGLE``);
  * vllm:   ``architectures: ["LlamaForCausalLM"]``, 1 layer; vLLM wraps it as ``EagleLlamaForCausalLM``
            (``speculative_config={"method": "eagle", ...}``). vLLM's EAGLE-1 ``fc`` has no bias: a head
            trained with one loses it there, so train with ``--fc-bias 0`` for vLLM;
  * eagle:  the EAGLE repository's ``EaModel`` (LlamaConfig, ``bias`` flag).
The reduced draft vocabulary (``d2t``/``t2d``) is an EAGLE-3 feature these EAGLE-1 loaders do not read: it
is dropped, and the engines draft over the full vocabulary (still lossless).
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from drafttree.errors import DraftTreeError
from drafttree.heads.assistant import MODEL_TYPES as ASSISTANT_TYPES
from drafttree.heads.dflash import is_dflash
from drafttree.heads.eagle3_format import read_eagle3, write_eagle3
from drafttree.heads.loading import head_layout, read_head_config, read_weights
from drafttree.heads.mtp import find_mtp

FORMATS = ("sglang", "vllm", "eagle", "speculators")
LLAMA_LIKE = {"llama", "mistral", "qwen2"}


def _write(out: Path, cfg: dict, state: dict, usage: str, warnings: list[str], head_dir, target: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "README.md").write_text(
        f"# EAGLE head for {target.get('name', '?')}\n\nExported by drafttree from {head_dir}.\n\n"
        f"```\n{usage}\n```\n" + "".join(f"\nNote: {w}\n" for w in warnings))


def export_eagle3(head_dir, cfg: dict, state: dict, layout: str, out: Path, fmt: str) -> dict:
    ck = read_eagle3(cfg, {k.removeprefix("model."): v for k, v in state.items()}, layout, where=str(head_dir))
    out_cfg, out_state = write_eagle3(ck, fmt)
    name = ck.target.get("name") or "TARGET"
    usage = {
        "sglang": f"python -m sglang.launch_server --model {name} --speculative-algorithm EAGLE3 "
                  f"--speculative-draft-model-path {out} --speculative-num-steps 5 --speculative-eagle-topk 8 "
                  "--speculative-num-draft-tokens 32",
        "vllm": f"vllm serve {name} --speculative-config "
                f"'{{\"method\": \"eagle3\", \"model\": \"{out}\", \"num_speculative_tokens\": 4}}'",
        "speculators": f"vllm serve {out}   # the config names its verifier ({name})",
        "eagle": f"EaModel.from_pretrained(base_model_path=..., ea_model_path='{out}', use_eagle3=True)",
    }[fmt]
    warnings = []
    if fmt == "eagle" and ck.aux_layers is not None and ck.target.get("num_hidden_layers"):
        n = ck.target["num_hidden_layers"]
        if list(ck.aux_layers) != [2, n // 2, n - 3]:
            warnings.append(f"the EAGLE repo always fuses layers 2, L/2, L-3; this head fuses {ck.aux_layers}")
    _write(out, out_cfg, out_state, usage, warnings, head_dir, ck.target)
    return {"format": fmt, "out": str(out), "keys": sorted(out_state), "warnings": warnings, "usage": usage}


def export_head(head_dir: str | Path, out_dir: str | Path, fmt: str) -> dict:
    if fmt not in FORMATS:
        raise DraftTreeError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if find_mtp(head_dir) is not None:
        raise DraftTreeError(f"{head_dir} is a model with its own MTP layer, which vLLM and SGLang read from the "
                             "model's checkpoint as it is: nothing to export")
    cfg = read_head_config(head_dir)
    if cfg.get("model_type") in ASSISTANT_TYPES:
        raise DraftTreeError(f"{head_dir} is a Gemma 4 assistant, a transformers model that vLLM and SGLang read as "
                             "it is: nothing to export")
    if is_dflash(cfg):
        raise DraftTreeError(f"{head_dir} is a DFlash drafter, published in the layout vLLM and SGLang read "
                             "(speculative method dflash): nothing to export")
    state = read_weights(head_dir)
    layout = head_layout(cfg, state)
    if layout != "eagle1":
        return export_eagle3(head_dir, cfg, state, layout, Path(out_dir), fmt)
    if fmt == "speculators":
        raise DraftTreeError("the speculators export is for EAGLE-3 heads; export EAGLE-1 heads as sglang, vllm "
                             "or eagle")
    meta = cfg.get("drafttree", {})
    mtype = cfg.get("model_type")
    if mtype not in LLAMA_LIKE:
        raise DraftTreeError(f"{fmt} loads EAGLE-1 heads as Llama decoder layers; this head's layer is {mtype!r}")
    state.pop("embed_tokens.weight", None)
    state.pop("d2t", None)
    state.pop("t2d", None)
    layers = meta.get("num_layers", 1)
    if layers != 1:
        raise DraftTreeError(f"{fmt} EAGLE-1 loaders expect one decoder layer; this head has {layers}")
    out_cfg = {k: v for k, v in cfg.items() if k != "drafttree"}
    out_cfg["model_type"] = "llama"
    out_cfg["num_hidden_layers"] = 1
    out_cfg["bias"] = "fc.bias" in state
    out_cfg["attention_bias"] = any(k.endswith("q_proj.bias") for k in state)
    out_cfg.pop("layer_types", None)
    out_cfg.pop("use_sliding_window", None)
    warnings = []
    if fmt == "sglang":
        out_cfg["architectures"] = ["LlamaForCausalLMEagle"]
    else:
        out_cfg["architectures"] = ["LlamaForCausalLM"]
    if fmt == "vllm" and out_cfg["bias"]:
        warnings.append("vLLM's EAGLE-1 fc has no bias and skips fc.bias: retrain with --fc-bias 0 for vLLM")
    if mtype == "qwen2" and fmt != "sglang":
        warnings.append("a Qwen2 head exported as a Llama layer relies on attention_bias=true being honoured")
    out = Path(out_dir)
    target = meta.get("target", {})
    usage = {
        "sglang": f"python -m sglang.launch_server --model {target.get('name', 'TARGET')} "
                  f"--speculative-algorithm EAGLE --speculative-draft-model-path {out} "
                  "--speculative-num-steps 5 --speculative-eagle-topk 8 --speculative-num-draft-tokens 32",
        "vllm": f"vllm serve {target.get('name', 'TARGET')} --speculative-config "
                f"'{{\"method\": \"eagle\", \"model\": \"{out}\", \"num_speculative_tokens\": 4}}'",
        "eagle": f"EaModel.from_pretrained(base_model_path=..., ea_model_path='{out}', use_eagle3=False)",
    }[fmt]
    _write(out, out_cfg, state, usage, warnings, head_dir, target)
    return {"format": fmt, "out": str(out), "keys": sorted(state), "warnings": warnings, "usage": usage}


def add_parser(sub) -> None:
    p = sub.add_parser("export-head",
                       help="write a head in the layout SGLang, vLLM, speculators or the EAGLE repo loads")
    p.add_argument("head", help="head directory (config.json + model.safetensors or pytorch_model.bin)")
    p.add_argument("out", help="output directory")
    p.add_argument("--format", default="sglang", choices=FORMATS)
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    res = export_head(args.head, args.out, args.format)
    for w in res["warnings"]:
        print(f"warning: {w}")
    print(f"wrote {res['out']} ({len(res['keys'])} tensors); serve with:\n  {res['usage']}")
    return 0
