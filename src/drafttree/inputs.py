"""Checks of what a caller passes (prompts, counts, stop strings, switches, seeds): one-line errors before anything
runs, shared by the Python API, and through it the command line and the server."""

from __future__ import annotations

import numbers

import torch

from drafttree.errors import DraftTreeError


def token_ids(prompt, vocab: int) -> torch.Tensor | None:
    """A prompt given as token ids (a 1-D integer tensor, a [1, n] one, or a list of ints) as a 1-D tensor, checked
    against the vocabulary; None for a prompt of text or messages."""
    if isinstance(prompt, (list, tuple)) and prompt and all(is_token_id(t) for t in prompt):
        prompt = torch.tensor([int(t) for t in prompt], dtype=torch.long)
    if not isinstance(prompt, torch.Tensor):
        return None
    if prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
        kind = str(prompt.dtype).replace("torch.", "")
        raise DraftTreeError(f"a token-id prompt must hold integers, got a {kind} tensor")
    if prompt.dim() > 2 or (prompt.dim() == 2 and prompt.shape[0] != 1):
        raise DraftTreeError(f"a token-id prompt must be 1-D (or [1, n]), got shape {list(prompt.shape)}; pass "
                             "several prompts as a list")
    ids = prompt.reshape(-1).long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise DraftTreeError(f"token ids must be in [0, {vocab}), got {int(ids.min())}..{int(ids.max())}")
    return ids


def encode_text(tok, prompt, chat: bool = True, tools: list[dict] | None = None) -> torch.Tensor:
    """Token ids of text or chat messages (the chat template, given ``tools`` where it has a use for them)."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DraftTreeError("empty prompt")
        check_text(prompt, "the prompt")
        if chat and getattr(tok, "chat_template", None):
            prompt = [{"role": "user", "content": prompt}]
        else:
            return torch.tensor(tok(prompt, add_special_tokens=True).input_ids, dtype=torch.long)
    if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        raise DraftTreeError("a prompt must be text, token ids or a non-empty list of {'role': ..., "
                             f"'content': ...}} messages, got {type(prompt).__name__}")
    prompt = [message_text(m, i) for i, m in enumerate(prompt)]
    if not getattr(tok, "chat_template", None):
        raise DraftTreeError("this model has no chat template: pass a plain string with chat=False")
    try:
        ids = tok.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
    except Exception as e:  # the model's template refuses these messages (a role it lacks, turns out of order)
        if type(e).__module__.startswith("jinja2"):
            raise DraftTreeError(f"the model's chat template refused these messages: {e}") from None
        raise
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return torch.tensor(ids, dtype=torch.long).reshape(-1)


def is_batch(prompt) -> bool:
    """A list of prompts (strings, token tensors or message lists), not one chat (a list of message dicts) nor one
    prompt of token ids (a list of ints)."""
    return (isinstance(prompt, (list, tuple)) and bool(prompt) and not isinstance(prompt[0], dict)
            and not all(is_token_id(t) for t in prompt))


INTERRUPTED = ("this generation was interrupted: another one started on the same model before it ended (read a "
               "stream to its end or close() it before starting another; several prompts at once: generate([...]) or "
               "stream_batch)")


def check_text(text: str, where: str) -> None:
    """Text a tokenizer can encode: Unicode without lone surrogates (what undecodable bytes become in a command
    line's arguments, or a JSON string's "\\ud800"), else a one-line error saying where."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DraftTreeError(f"{where} is not valid Unicode text: {text[e.start]!r} at character {e.start} (a lone "
                             "surrogate, e.g. bytes that are not UTF-8)") from None


def message_text(m: dict, i: int) -> dict:
    """A chat message with its content as text: a string, or OpenAI's content parts ([{"type": "text", "text": ...}],
    joined, as the server takes them); an assistant's tool calls may stand without content."""
    content = m["content"]
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content)
    elif content is None and m.get("role") == "assistant" and m.get("tool_calls"):
        return m
    if not isinstance(content, str):
        raise DraftTreeError(f"messages[{i}].content must be a string or a list of text parts "
                             f"({{'type': 'text', 'text': ...}}), got {type(content).__name__}")
    check_text(content, f"messages[{i}].content")
    return {**m, "content": content}


def check_flags(**flags) -> None:
    """Switches (chat, include_stop, ...) are True or False: a string such as "no" would read as true."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise DraftTreeError(f"{name} must be true or false, got {value!r}")


def check_options(options) -> None:
    """Method options are a dict of name: value (read before any option is parsed)."""
    if not isinstance(options, dict):
        raise DraftTreeError(f"method_options must be a dict of name: value, got {type(options).__name__} {options!r}")


def check_positive_int(value, name: str, none_ok: bool = False) -> None:
    """A count (max_new_tokens, max_batch): an integer >= 1, not a float, string or bool, else a one-line error."""
    if value is None and none_ok:
        return
    if not is_token_id(value) or value <= 0:
        raise DraftTreeError(f"{name} must be a positive integer, got {value!r}")


def stop_strings(stop) -> list[str]:
    """``stop`` as a list of non-empty strings (one string, or a list or tuple of them), else a one-line error."""
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, (list, tuple)) else None
    if stop is None:
        return []
    if stops is None or not all(isinstance(x, str) for x in stops):
        raise DraftTreeError(f"stop must be a string or a list of strings, got {stop!r}")
    if any(not x for x in stops):
        raise DraftTreeError("stop strings must be non-empty")
    for x in stops:
        check_text(x, "a stop string")
    return list(stops)


def is_token_id(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


SEED_MASK = 2**64 - 1  # torch seeds are unsigned 64-bit; larger or negative seeds wrap, as the server's do


def seed_value(seed) -> int:
    if not is_token_id(seed):
        raise DraftTreeError(f"seed must be an integer, got {seed!r}")
    return int(seed) & SEED_MASK


def end_token_ids(stop_token_ids, ignore_eos: bool, vocab: int, eos_ids) -> frozenset[int]:
    """The tokens that end a generation: ``eos_ids`` (none with ``ignore_eos``) and ``stop_token_ids`` (a token id or
    a list of them, checked against the vocabulary)."""
    if stop_token_ids is not None and not is_token_id(stop_token_ids) and not isinstance(stop_token_ids,
                                                                                         (list, tuple)):
        raise DraftTreeError(f"stop_token_ids must be a token id or a list of them, got {stop_token_ids!r}")
    ids = [stop_token_ids] if is_token_id(stop_token_ids) else list(stop_token_ids or [])
    bad = [t for t in ids if not is_token_id(t) or not 0 <= t < vocab]
    if bad:
        raise DraftTreeError(f"stop_token_ids must be token ids in 0..{vocab - 1}, got {bad[0]!r}")
    if not isinstance(ignore_eos, bool):
        raise DraftTreeError(f"ignore_eos must be true or false, got {ignore_eos!r}")
    return frozenset(int(t) for t in ids) | (frozenset() if ignore_eos else frozenset(eos_ids))
