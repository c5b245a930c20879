"""Function calling, as OpenAI's chat API defines it.

A named function (``tool_choice: {"type": "function", "function": {"name": ...}}``) or ``"required"`` (one or more
calls of the given tools) need no model-specific parser: the answer is decoded under a JSON schema built from the tools
(grammar.py: every method exact for it) and returned as ``tool_calls``, as vLLM does for these choices. ``"auto"`` (the
default with tools) lets the model choose between text and calls, so its calls are read from the model's own format:
with ``serve --tool-call-parser hermes`` (vLLM's flag and name), the ``<tool_call>{"name": ..., "arguments": ...}
</tool_call>`` blocks that Qwen2.5, Hermes and SmolLM2's templates ask for (and an answer that is only such a call,
bare or fenced, as Qwen2.5-Coder answers; ``llama3_json``: Llama 3's JSON calls); without a parser ``"auto"`` is a
400 that says so (as vLLM answers). ``"none"`` ignores the tools.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

MAX_TOOLS = 128
# --tool-call-parser: the model formats whose calls "auto" can read (vLLM's names). One reader serves both: Llama 3's
# JSON calls ({"name": ..., "parameters": ...}, after <|python_tag|> or not, several joined by ";") are a bare answer
PARSERS = ("hermes", "llama3_json")
PYTHON_TAG = "<|python_tag|>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(CALL_OPEN) + r"(.*?)(?:" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


def _call(name: str, args) -> dict:
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": {"name": name, "arguments": text}}


_FENCED = re.compile(r"```(?:json)?\s*\n(.*)\n\s*```", re.DOTALL)


def _parsed_calls(block: str, names) -> list[dict] | None:
    """The calls in one block of JSON: ``{"name": N, "arguments": {...}}`` or a list of them, N a given tool."""
    try:
        value = json.loads(block)
    except json.JSONDecodeError:
        return None
    calls = []
    for c in value if isinstance(value, list) else [value]:
        if not isinstance(c, dict) or c.get("name") not in names:
            return None
        args = c.get("arguments", c.get("parameters", {}))
        if not isinstance(args, (dict, str)):
            return None
        calls.append(_call(c["name"], args))
    return calls or None


def hermes_calls(text: str, names) -> tuple[str | None, list[dict]] | None:
    """(the text before the first call, or None where there is none; the calls) from Hermes-format text: each
    ``<tool_call>...</tool_call>`` block holds one call ``{"name": N, "arguments": {...}}`` or a list of them (the last
    block may end with the text). An answer that is nothing but such a call, bare or in one ```json fence (as
    Qwen2.5-Coder writes calls), is read too. None when there is no call, or a block does not parse or names no given
    tool: then the answer is text, as the model wrote it."""
    start = text.find(CALL_OPEN)
    if start < 0:
        whole = text.strip().removeprefix(PYTHON_TAG).strip()
        fenced = _FENCED.fullmatch(whole)
        if fenced is None and not whole.startswith(("{", "[")):
            return None
        calls = _parsed_calls(fenced.group(1) if fenced else whole, names)
        if calls is None and fenced is None and ";" in whole:  # Llama 3's calls joined by ";"
            parts = [_parsed_calls(part, names) for part in whole.split(";")]
            calls = None if any(c is None for c in parts) else [c for part in parts for c in part]
        return None if calls is None else (None, calls)
    calls = []
    for block in _BLOCK.finditer(text, start):
        got = _parsed_calls(block.group(1), names)
        if got is None:
            return None
        calls += got
    rest = _BLOCK.sub("", text[start:]).strip()
    if not calls or rest:  # text between or after the calls: not a call the parser can vouch for
        return None
    return text[:start].strip() or None, calls


@dataclass(frozen=True)
class ToolMode:
    """What a request's tools ask of the answer: ``schema`` to decode under, ``name`` of a forced function (None: the
    answer is a list of calls, "required"); ``schema`` None: "auto", the model's own calls read from its text by the
    server's parser (``names``: the tools it may call)."""

    schema: dict | None
    name: str | None = None
    names: frozenset = frozenset()

    @property
    def auto(self) -> bool:
        return self.schema is None

    def calls(self, text: str) -> list[dict] | None:
        """OpenAI's ``tool_calls`` from a finished answer; None where the text does not parse (cut short)."""
        try:
            value = json.loads(text)
            pairs = [(self.name, value)] if self.name is not None else [(c["name"], c["parameters"]) for c in value]
        except (json.JSONDecodeError, KeyError, TypeError):  # cut short (the grammar admits nothing else)
            return None
        return [_call(name, args) for name, args in pairs]


def check_tools(tools) -> list[dict]:
    """The request's ``tools``, checked (ValueError: a one-line message for a 400)."""
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ValueError(f"must be a list of at most {MAX_TOOLS} tools")
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': "
                             "{...}}}}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        if fn["name"] in names:
            raise ValueError(f"tools[{i}]: the name {fn['name']!r} is given twice")
        names.add(fn["name"])
    return tools


def tool_mode(tools: list[dict] | None, choice) -> ToolMode | None:
    """The schema a request's tools and tool_choice put on its answer (``auto``: none, the server's parser reads the
    calls); None without tools or with "none". ValueError (a 400 on ``tool_choice``) for a choice that is not one."""
    if choice in (None, "none") and not tools:
        return None
    if choice == "none":
        return None
    if not tools:
        raise ValueError("needs tools")
    by_name = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in tools}
    if choice in (None, "auto"):
        return ToolMode(None, names=frozenset(by_name))
    if choice == "required":
        calls = [{"type": "object", "properties": {"name": {"const": n}, "parameters": p},
                  "required": ["name", "parameters"], "additionalProperties": False} for n, p in by_name.items()]
        return ToolMode({"type": "array", "items": {"anyOf": calls}, "minItems": 1})
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(fn, dict) or fn.get("name") not in by_name:
        raise ValueError("must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': N}} with N "
                         f"one of the tools ({', '.join(by_name)})")
    return ToolMode(by_name[fn["name"]], fn["name"])


AUTO_NEEDS_PARSER = ("'auto' (the default with tools) reads calls in the model's own format: start the server with "
                     f"--tool-call-parser ({', '.join(PARSERS)}), or send 'required' or {{'type': 'function', "
                     "'function': {'name': ...}}")


def tool_message(res: dict, tools) -> tuple[dict, str]:
    """(the chat message, the finish reason) of one finished choice: its tool calls where the request's tools asked for
    them and the answer parses (finish_reason "tool_calls"; "auto": with the text before them as content), else its
    text."""
    found = None
    if tools is not None and res["finish_reason"] == "stop":
        found = hermes_calls(res["text"], tools.names) if tools.auto else (None, tools.calls(res["text"]))
    if found is None or found[1] is None:
        return {"role": "assistant", "content": res["text"]}, res["finish_reason"]
    return {"role": "assistant", "content": found[0], "tool_calls": found[1]}, "tool_calls"


class CallStream:
    """An "auto" answer streamed: its text goes out as it comes up to the first ``<tool_call>`` (a tail that may be
    the tag's beginning is held back a round), what follows is held until the end, when it is calls or, where it
    does not parse, text. An answer that begins as JSON or a fence may be only a call (hermes_calls): held whole."""

    def __init__(self):
        self.text, self.sent, self.holding = "", 0, False

    def feed(self, piece: str) -> str:
        """What of the answer so far may be sent now."""
        self.text += piece
        if self.holding:
            return ""
        if self.sent == 0 and self._may_be_bare_call(self.text.lstrip()):
            return ""
        at = self.text.find(CALL_OPEN, max(0, self.sent - len(CALL_OPEN)))
        if at >= 0:
            self.holding = True
            end = at
        else:
            keep = next((k for k in range(len(CALL_OPEN) - 1, 0, -1) if self.text.endswith(CALL_OPEN[:k])), 0)
            end = len(self.text) - keep
        out, self.sent = self.text[self.sent:max(self.sent, end)], max(self.sent, end)
        return out

    @staticmethod
    def _may_be_bare_call(head: str) -> bool:
        """Whether an answer beginning so may still be nothing but a call (JSON, or a ```json fence)."""
        starts = ("```json", "```\n", PYTHON_TAG)
        return (not head or head[0] in "{[" or head.startswith(starts)
                or any(f.startswith(head) for f in starts))

    def rest(self, text: str) -> str:
        """At the end, where the answer is text: what has not been sent of it (``text``: the finished answer)."""
        return text[self.sent:] if text.startswith(self.text[: self.sent]) else ""
