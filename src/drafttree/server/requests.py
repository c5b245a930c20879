"""Validating OpenAI-style request bodies: every mistake a client can make is a :class:`RequestError` with an
OpenAI-style error body (HTTP 400), never an exception inside the server."""

from __future__ import annotations

import json
import math

from drafttree.drafters import METHODS

MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_TOKENS = 256
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; send "temperature": 0 for greedy (token-identical) decoding
ROUTES = {
    "/": ("GET",), "/index.html": ("GET",), "/health": ("GET",), "/v1/models": ("GET",),
    "/v1/drafttree/methods": ("GET",), "/v1/chat/completions": ("POST",), "/v1/completions": ("POST",),
}
ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(Exception):
    """An HTTP error answered with an OpenAI-style error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> RequestError:
    return RequestError(400, message, param, code)


# ------------------------------------------------------------------------------------------ validation


def _number(body: dict, key: str, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad_request(f"'{key}' must be a finite number, got {json.dumps(v)}", key, "invalid_type")
    return float(v)


def _integer(body: dict, key: str, default: int | None) -> int | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{key}' must be an integer, got {json.dumps(v)}", key, "invalid_type")
    return v


def sampling_params(body: dict, methods: list[str]) -> dict:
    """The generation keyword arguments shared by both endpoints, validated."""
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise bad_request("'model' must be a string", "model", "invalid_type")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, key, DEFAULT_MAX_TOKENS)
    if max_tokens <= 0:
        raise bad_request(f"'{key}' must be > 0, got {max_tokens}", key, "invalid_value")
    temperature = _number(body, "temperature", DEFAULT_TEMPERATURE)
    if temperature < 0:
        raise bad_request(f"'temperature' must be >= 0, got {temperature}", "temperature", "invalid_value")
    top_p = _number(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}", "top_p", "invalid_value")
    top_k = _integer(body, "top_k", 0)
    if top_k < 0:
        raise bad_request(f"'top_k' must be >= 0 (0 = off), got {top_k}", "top_k", "invalid_value")
    n = _integer(body, "n", 1)
    if n != 1:
        raise bad_request("only n=1 is supported (one completion per request)", "n", "invalid_value")
    seed = _integer(body, "seed", None)
    if seed is not None:
        seed &= 2**64 - 1  # torch seeds are unsigned 64-bit; any JSON integer maps to one
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("'stop' must be a non-empty string or a list of non-empty strings", "stop", "invalid_type")
    if len(stop) > 16:
        raise bad_request("at most 16 stop strings", "stop", "invalid_value")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream", "invalid_type")
    method = body.get("method")
    if method is not None:
        if not isinstance(method, str):
            raise bad_request("'method' must be a string", "method", "invalid_type")
        if method not in methods:
            why = "unknown method" if method not in METHODS else "method not available for this model"
            raise bad_request(f"{why} {method!r}; choose one of {', '.join(methods)}", "method", "invalid_value")
    for key in ("logprobs", "echo"):
        if body.get(key):
            raise bad_request(f"'{key}' is not supported by this server", key, "unsupported")
    if body.get("suffix") is not None:
        raise bad_request("'suffix' is not supported by this server", "suffix", "unsupported")
    return {"max_new_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k,
            "stop": stop, "seed": seed, "method": method, "stream": stream}


def _content_text(content, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad_request(f"messages[{i}].content: only text parts are supported", f"messages[{i}].content",
                           "invalid_type")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content",
               "invalid_type")


def parse_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise bad_request("'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(msgs, list):
        raise bad_request("'messages' must be a list of {role, content} objects", "messages", "invalid_type")
    if not msgs:
        raise bad_request("'messages' must not be empty", "messages", "invalid_value")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role",
                       "invalid_value")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        out.append({"role": "system" if role == "developer" else role, "content": _content_text(content, i)})
    if not any(m["content"].strip() for m in out):
        raise bad_request("'messages' contain no text", "messages", "invalid_value")
    return out


def parse_prompt(body: dict):
    """A completion prompt: a string, a list holding one string, or a list of token ids."""
    p = body.get("prompt")
    if p is None:
        raise bad_request("'prompt' is required", "prompt", "missing_required_parameter")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if isinstance(p, str):
        if not p.strip():
            raise bad_request("'prompt' must not be empty", "prompt", "invalid_value")
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return p
    raise bad_request("'prompt' must be a non-empty string (or a list of token ids); batches are not supported",
                      "prompt", "invalid_type")


# ----------------------------------------------------------------------------------------------- app
