"""Validating OpenAI-style request bodies: every mistake a client can make is a :class:`RequestError` with an
OpenAI-style error body (HTTP 400), never an exception inside the server."""

from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError

from drafttree.drafters import METHODS

MAX_BODY_BYTES = 4 * 1024 * 1024
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


def _param(loc: tuple) -> str:
    """pydantic's error location -> OpenAI's ``param`` ("messages[0].content")."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[TextPart]", "int", "float", "bool", "list[str]", "function-after[_check()]"):
            continue  # the branch of a union that failed, not a field
        else:
            out += ("." if out else "") + str(part)
    return out


def validate(schema: type[BaseModel], body, methods: list[str]) -> BaseModel:
    """Parse a request body with its pydantic schema; the first problem becomes a 400 with OpenAI's fields."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    try:
        req = schema.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = _param(err["loc"]) or None
        code = "missing_required_parameter" if err["type"] == "missing" else (
            "invalid_type" if "type" in err["type"] or err["type"].endswith("_parsing") else "invalid_value")
        msg = err["msg"].removeprefix("Value error, ")
        raise bad_request(f"{param}: {msg}" if param else msg, param, code) from None
    if req.method is not None and req.method not in methods:
        why = "unknown method" if req.method not in METHODS else "method not available for this model"
        raise bad_request(f"{why} {req.method!r}; choose one of {', '.join(methods)}", "method", "invalid_value")
    return req


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


def _tool_calls(calls, i: int) -> list[dict]:
    """An assistant message's earlier tool calls, arguments parsed (chat templates render them as objects)."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list", where, "invalid_type")
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}: each call needs function.name and function.arguments", where, "invalid_value")
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            raise bad_request(f"{where}: function.arguments must be JSON text", where, "invalid_value") from None
        out.append({"id": c.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


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
        if m.get("function_call"):  # OpenAI's deprecated form: would be dropped from the prompt, say so instead
            raise bad_request(f"messages[{i}].function_call is not supported: send tool_calls",
                              f"messages[{i}].function_call", "invalid_value")
        content = m.get("content")
        calls = _tool_calls(m.get("tool_calls"), i) if role == "assistant" and m.get("tool_calls") else None
        if content is None and role == "assistant":
            content = "" if calls is None else json.dumps([c["function"] for c in calls], ensure_ascii=False)
        msg = {"role": "system" if role == "developer" else role, "content": _content_text(content, i)}
        if calls is not None:  # for templates that render calls (the text above for those that do not)
            msg["tool_calls"] = calls
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            msg["tool_call_id"] = m["tool_call_id"]
        name = m.get("name")
        if name is not None:  # a participant's name goes to the chat template, as vLLM passes it (templates that
            if not isinstance(name, str) or not name:  # have no use for it ignore it)
                raise bad_request(f"messages[{i}].name must be a non-empty string", f"messages[{i}].name",
                                  "invalid_type")
            msg["name"] = name
        out.append(msg)
    if not any(m["content"].strip() for m in out):
        raise bad_request("'messages' contain no text", "messages", "invalid_value")
    return out


def _ids(p) -> bool:
    return isinstance(p, list) and bool(p) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)


def parse_prompt(body: dict) -> list:
    """A completion request's prompts, as OpenAI takes them: a string, a list of token ids, or a list of either (a
    batch: each prompt gets ``n`` choices, indexed prompt by prompt)."""
    p = body.get("prompt")
    if p is None:
        raise bad_request("'prompt' is required", "prompt", "missing_required_parameter")
    prompts = [p] if isinstance(p, str) or _ids(p) else p
    if not isinstance(prompts, list) or not prompts or not all(isinstance(x, str) or _ids(x) for x in prompts):
        raise bad_request("'prompt' must be a non-empty string, a list of token ids, or a list of those (a batch)",
                          "prompt", "invalid_type")
    for i, x in enumerate(prompts):
        if isinstance(x, str) and not x.strip():
            raise bad_request("'prompt' must not be empty" if len(prompts) == 1 else f"prompt {i} is empty",
                              "prompt", "invalid_value")
    return prompts


# ----------------------------------------------------------------------------------------------- app
