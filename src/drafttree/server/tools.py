"""Function calling, as OpenAI's chat API defines it, for the tool choices that need no model-specific parser: a named
function (``tool_choice: {"type": "function", "function": {"name": ...}}``) or ``"required"`` (one or more calls of
the given tools). The answer is decoded under a JSON schema built from the tools (grammar.py: every method exact for
it) and returned as ``tool_calls``, as vLLM does for these choices. ``"auto"`` would need a parser for each model
family's own call format: refused with a 400 that says so (as vLLM does without a tool parser); ``"none"`` ignores
the tools.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

MAX_TOOLS = 128


@dataclass(frozen=True)
class ToolMode:
    """What a request's tools ask of the answer: ``schema`` to decode under, ``name`` of a forced function (None: the
    answer is a list of calls, "required")."""

    schema: dict
    name: str | None = None

    def calls(self, text: str) -> list[dict] | None:
        """OpenAI's ``tool_calls`` from a finished answer; None where the text does not parse (cut short)."""
        try:
            value = json.loads(text)
            pairs = [(self.name, value)] if self.name is not None else [(c["name"], c["parameters"]) for c in value]
        except (json.JSONDecodeError, KeyError, TypeError):  # cut short (the grammar admits nothing else)
            return None
        return [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
                for name, args in pairs]


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
    """The schema a request's tools and tool_choice put on its answer; None when they put none ("none", no tools).
    ValueError (a 400 on ``tool_choice``) for what this server cannot do."""
    if choice in (None, "none") and not tools:
        return None
    if choice == "none":
        return None
    if not tools:
        raise ValueError("needs tools")
    by_name = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in tools}
    if choice in (None, "auto"):
        raise ValueError("'auto' (the default with tools) needs a parser of the model's own tool-call format, which "
                         "this server does not have: send 'required' or {'type': 'function', 'function': {'name': "
                         "...}}")
    if choice == "required":
        calls = [{"type": "object", "properties": {"name": {"const": n}, "parameters": p},
                  "required": ["name", "parameters"], "additionalProperties": False} for n, p in by_name.items()]
        return ToolMode({"type": "array", "items": {"anyOf": calls}, "minItems": 1})
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(fn, dict) or fn.get("name") not in by_name:
        raise ValueError(f"must be 'none', 'required' or {{'type': 'function', 'function': {{'name': N}}}} with N "
                         f"one of the tools ({', '.join(by_name)})")
    return ToolMode(by_name[fn["name"]], fn["name"])


def tool_message(res: dict, tools) -> tuple[dict, str]:
    """(the chat message, the finish reason) of one finished choice: its tool calls where the request's tools asked for
    them and the answer parses (finish_reason "tool_calls"), else its text."""
    calls = tools.calls(res["text"]) if tools is not None and res["finish_reason"] == "stop" else None
    if calls is None:
        return {"role": "assistant", "content": res["text"]}, res["finish_reason"]
    return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
