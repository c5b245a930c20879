"""Hermes-format tool calls (server/tools.py): parsing a finished answer, and streaming one without ever sending part
of a call as text."""

from __future__ import annotations

import json

import pytest

from drafttree.server.tools import CallStream, ToolMode, hermes_calls, tool_message, tool_mode

NAMES = {"get_weather", "get_time"}
WEATHER = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
TIME = '{"name": "get_time", "arguments": {"timezone": "CET"}}'


def names_args(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("text,content,expected", [
    (f"<tool_call>\n{WEATHER}\n</tool_call>", None, [("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    (f"Let me check.\n<tool_call>{WEATHER}</tool_call>", "Let me check.",
     [("get_weather", {"city": "Oslo", "unit": "celsius"})]),
    (f"<tool_call>{WEATHER}</tool_call>\n<tool_call>{TIME}</tool_call>\n", None,
     [("get_weather", {"city": "Oslo", "unit": "celsius"}), ("get_time", {"timezone": "CET"})]),
    (f"<tool_call>[{WEATHER}, {TIME}]</tool_call>", None,  # SmolLM2's form: a list in one block
     [("get_weather", {"city": "Oslo", "unit": "celsius"}), ("get_time", {"timezone": "CET"})]),
    (f"<tool_call>{TIME}", None, [("get_time", {"timezone": "CET"})]),  # the end token came before the closing tag
    ('<tool_call>{"name": "get_time", "parameters": {"timezone": "UTC"}}</tool_call>', None,
     [("get_time", {"timezone": "UTC"})]),
    (f"  {TIME}\n", None, [("get_time", {"timezone": "CET"})]),  # an answer that is only a call, bare ...
    (f"```json\n{WEATHER}\n```", None, [("get_weather", {"city": "Oslo", "unit": "celsius"})]),  # ... or fenced
    ('<|python_tag|>{"name": "get_time", "parameters": {"timezone": "CET"}}', None,  # Llama 3's forms
     [("get_time", {"timezone": "CET"})]),
    ('{"name": "get_time", "parameters": {"timezone": "CET"}}; {"name": "get_time", "parameters": {"timezone": "UTC"}}',
     None, [("get_time", {"timezone": "CET"}), ("get_time", {"timezone": "UTC"})]),
])
def test_hermes_calls_parse(text, content, expected):
    got = hermes_calls(text, NAMES)
    assert got is not None
    assert got[0] == content and names_args(got[1]) == expected
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got[1])
    assert len({c["id"] for c in got[1]}) == len(got[1])


def test_hermes_arguments_given_as_text_are_kept():
    got = hermes_calls('<tool_call>{"name": "get_time", "arguments": "{\\"timezone\\": \\"CET\\"}"}</tool_call>',
                       NAMES)
    assert got[1][0]["function"]["arguments"] == '{"timezone": "CET"}'


@pytest.mark.parametrize("text", [
    "No call here, just text.",
    "<tool_call>{not json}</tool_call>",
    '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>',  # not one of the request's tools
    '<tool_call>{"arguments": {}}</tool_call>',
    '<tool_call>{"name": "get_time", "arguments": 5}</tool_call>',
    f"<tool_call>{WEATHER}</tool_call> and then some text",  # text after a call: not vouched for
    "<tool_call>",
    f"Here is the call: {TIME}",  # a bare call is read only where it is the whole answer
    f"```json\n{TIME}\n```\nDone.",
    '{"name": "get_time"',
    '{"city": "Oslo"}',
    f"{TIME}; and then text",  # every part of a ";"-joined answer must be a call
])
def test_hermes_text_that_is_not_calls(text):
    assert hermes_calls(text, NAMES) is None


def test_tool_message_auto():
    mode = ToolMode(None, names=frozenset(NAMES))
    msg, finish = tool_message({"text": f"Sure. <tool_call>{TIME}</tool_call>", "finish_reason": "stop"}, mode)
    assert finish == "tool_calls" and msg["content"] == "Sure." and names_args(msg["tool_calls"])[0][0] == "get_time"
    cut = {"text": '<tool_call>{"name": "get_time", "argum', "finish_reason": "length"}  # cut short: text
    assert tool_message(cut, mode) == ({"role": "assistant", "content": cut["text"]}, "length")
    plain = {"text": "It is sunny.", "finish_reason": "stop"}
    assert tool_message(plain, mode) == ({"role": "assistant", "content": "It is sunny."}, "stop")


def test_tool_mode_auto_is_the_default_with_tools():
    tools = [{"type": "function", "function": {"name": n}} for n in sorted(NAMES)]
    for choice in (None, "auto"):
        mode = tool_mode(tools, choice)
        assert mode.auto and mode.names == NAMES and mode.schema is None
    assert not tool_mode(tools, "required").auto
    with pytest.raises(ValueError, match="needs tools"):
        tool_mode(None, "auto")


@pytest.mark.parametrize("text", [
    f"Let me check. <tool_call>{WEATHER}</tool_call>",
    "Plain text with a < sign and <tool but no call.",
    f"<tool_call>{TIME}</tool_call>",
    "ends with a partial tag <tool_ca",
    f"  {TIME}",  # may be only a call: nothing goes out before the end
    "{ not a call, but JSON-like } and text",
    "```python\nprint(1)\n```",  # a fence that cannot hold a call goes out as it comes
    '<|python_tag|>{"name": "get_time", "parameters": {}}',  # Llama 3's call: held whole
])
def test_call_stream_never_sends_part_of_a_call(text):
    """Every split of the text into three pieces: what is sent before the end is exactly the text before the first
    call (no piece of the tag, even split across pieces); where there is no call the end completes the text."""
    start = text.find("<tool_call>")
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 7):
            s = CallStream()
            sent = s.feed(text[:i]) + s.feed(text[i:j]) + s.feed(text[j:])
            if start >= 0:
                assert sent == text[:start]
            else:
                assert sent + s.rest(text) == text
                assert sent == "" or not text.lstrip().startswith(("{", "<|python_tag|>"))
                if text.startswith("```python") and i > len("```python"):
                    assert sent
