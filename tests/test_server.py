"""``drafttree serve``: the OpenAI-compatible server (FastAPI + uvicorn, batched decoding) on the real default model
(float32, prompt lookup)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

import pytest

from drafttree import SpeculativeModel
from drafttree.server import ServerThread, create_app

PROMPT = "Name three colours of the rainbow."
MESSAGES = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def sm(default_fp32):
    return SpeculativeModel(default_fp32, method="lookup")


@pytest.fixture(scope="module")
def server(sm):
    srv = ServerThread(create_app(sm, max_body_bytes=256 * 1024)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def expected(sm):
    return sm.generate(MESSAGES, max_new_tokens=12)


def request(server, method: str, path: str, body=None, raw: bytes | None = None, headers: dict | None = None):
    """(status, headers, body bytes) without raising on HTTP errors."""
    host, port = server.server_address[:2]
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def post(server, path, body):
    status, _, data = request(server, "POST", path, body)
    return status, json.loads(data)


def sse_events(data: bytes) -> list[str]:
    text = data.decode()
    assert text.endswith("\n\n")
    return [e[len("data: "):] for e in text.split("\n\n") if e]


def stream_text(server, body) -> str:
    """The streamed answer of a chat request, its deltas joined."""
    status, _, data = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200
    events = sse_events(data)
    assert events[-1] == "[DONE]"
    return "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]
                   if json.loads(e)["choices"])


def test_health_and_models(server, sm):
    status, headers, data = request(server, "GET", "/health")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert json.loads(data)["status"] == "ok"
    status, _, data = request(server, "GET", "/v1/models")
    body = json.loads(data)
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [sm.target.name] and body["data"][0]["object"] == "model"


def test_methods_endpoint(server):
    status, _, data = request(server, "GET", "/v1/drafttree/methods")
    info = json.loads(data)
    assert status == 200 and info["default"] == "lookup"
    assert "ar" in info["methods"] and "lookup" in info["methods"] and "eagle2" not in info["methods"]  # no head


def test_chat_completion_equals_generate(server, sm, expected):
    status, body = post(server, "/v1/chat/completions", {"model": sm.target.name, "messages": MESSAGES,
                                                         "max_tokens": 12, "temperature": 0})
    assert status == 200 and body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": expected.text}
    assert choice["finish_reason"] == ("stop" if expected.finish_reason == "stop" else "length")
    assert body["usage"] == {"prompt_tokens": expected.prompt_tokens, "completion_tokens": expected.new_tokens,
                             "total_tokens": expected.prompt_tokens + expected.new_tokens}
    dt = body["drafttree"]
    assert set(dt) == {"method", "tau", "target_forwards", "tokens_per_second", "accept_lengths", "wall_time"}
    assert dt["method"] == "lookup" and sum(dt["accept_lengths"]) == expected.new_tokens
    assert len(dt["accept_lengths"]) == dt["target_forwards"]


def test_tiny_temperatures_are_greedy(server, expected):
    """As vLLM reads them: under 1e-5 is greedy (the library itself refuses 0 < t < 1e-6: logits / t overflow)."""
    for t in (1e-300, 1e-7, 9e-6):
        status, body = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12,
                                                             "temperature": t})
        assert status == 200 and body["choices"][0]["message"]["content"] == expected.text


def test_per_request_method_and_max_completion_tokens(server, expected):
    status, body = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 12,
                                                         "temperature": 0, "method": "ar"})
    assert status == 200 and body["choices"][0]["message"]["content"] == expected.text
    assert body["drafttree"]["method"] == "ar" and body["drafttree"]["tau"] == 1.0


def test_streaming_chat(server, expected):
    status, headers, data = request(server, "POST", "/v1/chat/completions",
                                    {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(data)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    body, final = chunks[:-1], chunks[-1]
    assert body and all(c["choices"][0]["finish_reason"] is None for c in body)
    assert all(isinstance(c["drafttree"]["accepted"], int) and c["drafttree"]["step"] >= 1 for c in body)
    assert sum(c["drafttree"]["accepted"] for c in body) == expected.new_tokens
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == expected.text
    assert final["choices"][0]["finish_reason"] in ("stop", "length")
    assert final["drafttree"]["target_forwards"] == sum(1 for c in body if c["drafttree"]["accepted"])
    assert "usage" not in final  # only when asked for (stream_options.include_usage)


def test_streaming_usage_when_asked_for(server, expected):
    """``stream_options.include_usage``: ``usage: null`` on every chunk, then one chunk with no choices and the usage,
    as OpenAI streams it."""
    status, _, data = request(server, "POST", "/v1/chat/completions",
                              {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True,
                               "stream_options": {"include_usage": True}})
    events = sse_events(data)
    chunks = [json.loads(e) for e in events[:-1]]
    assert status == 200 and events[-1] == "[DONE]"
    *body, last = chunks
    assert all(c["usage"] is None and len(c["choices"]) == 1 for c in body)
    assert body[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": expected.prompt_tokens, "completion_tokens": expected.new_tokens,
        "total_tokens": expected.prompt_tokens + expected.new_tokens}


def test_unknown_model_is_404(server, sm):
    status, out = post(server, "/v1/chat/completions", {"model": "gpt-4o", "messages": MESSAGES, "max_tokens": 2})
    assert status == 404 and out["error"]["code"] == "model_not_found" and out["error"]["param"] == "model"
    assert sm.target.name in out["error"]["message"]
    status, out = post(server, "/v1/completions", {"model": sm.target.name, "prompt": "Hi", "max_tokens": 2})
    assert status == 200


def test_completions_raw_prompt(server, sm):
    prompt = "The three primary colours are"
    want = sm.generate(prompt, max_new_tokens=8, chat=False)
    status, body = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                                    "stop": "\n\n"})
    assert status == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == want.text.split("\n\n")[0]
    assert body["usage"]["prompt_tokens"] == want.prompt_tokens
    status, headers, data = request(server, "POST", "/v1/completions",
                                    {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True})
    events = sse_events(data)
    assert status == 200 and events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == want.text


def test_stop_and_seed(server):
    body = {"messages": [{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
            "max_tokens": 60, "temperature": 0, "stop": ["7"]}
    status, out = post(server, "/v1/chat/completions", body)
    text = out["choices"][0]["message"]["content"]
    assert status == 200 and out["choices"][0]["finish_reason"] == "stop" and "7" not in text and "6" in text
    sampled = {"messages": MESSAGES, "max_tokens": 10, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": 5}
    a, b = post(server, "/v1/chat/completions", sampled)[1], post(server, "/v1/chat/completions", sampled)[1]
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_n_completions_are_n_rows_each_with_its_own_seed(server, expected):
    """``n``: one choice per row of the batch; with a seed, choice i is what the same request with seed + i gives alone
    (so the choices differ and each is reproducible); greedy, every choice is the greedy answer; usage counts the
    prompt once and every choice's tokens."""
    sampled = {"messages": MESSAGES, "max_tokens": 8, "temperature": 1.0, "seed": 11}
    status, out = post(server, "/v1/chat/completions", {**sampled, "n": 3})
    assert status == 200 and [c["index"] for c in out["choices"]] == [0, 1, 2]
    alone = [post(server, "/v1/chat/completions", {**sampled, "seed": 11 + i})[1] for i in range(3)]
    assert [c["message"]["content"] for c in out["choices"]] == [a["choices"][0]["message"]["content"] for a in alone]
    assert out["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"]
    assert out["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone)
    assert len(out["drafttree"]) == 3
    greedy = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "n": 2}
    status, out = post(server, "/v1/chat/completions", greedy)
    assert status == 200 and [c["message"]["content"] for c in out["choices"]] == [expected.text] * 2
    status, out = post(server, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 4, "n": 2,
                                                   "temperature": 0})
    assert status == 200 and len(out["choices"]) == 2 and out["choices"][0]["text"] == out["choices"][1]["text"]


BAD = [
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
    ({"messages": MESSAGES, "max_tokens": -5}, "max_tokens"),
    ({"messages": MESSAGES, "max_tokens": "12"}, "max_tokens"),
    ({"messages": MESSAGES, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": MESSAGES, "temperature": -0.5}, "temperature"),
    ({"messages": MESSAGES, "temperature": "hot"}, "temperature"),
    ({"messages": MESSAGES, "top_p": 0}, "top_p"),
    ({"messages": MESSAGES, "top_p": 1.5}, "top_p"),
    ({"messages": MESSAGES, "top_k": -2}, "top_k"),
    ({"messages": MESSAGES, "stop": [""]}, "stop"),
    ({"messages": MESSAGES, "stop": 7}, "stop"),
    ({"messages": MESSAGES, "seed": "x"}, "seed"),
    ({"messages": MESSAGES, "stream": "yes"}, "stream"),
    ({"messages": MESSAGES, "method": "nope"}, "method"),
    ({"messages": MESSAGES, "method": "eagle2"}, "method"),  # needs a head this server did not load
    ({"messages": MESSAGES, "n": 17}, "n"),
    ({"messages": MESSAGES, "n": 0}, "n"),
    ({"messages": MESSAGES, "logprobs": "yes"}, "logprobs"),
    ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    # fields that would change the output are refused, not ignored (their no-op values pass: NO_OPS below)
    ({"messages": MESSAGES, "response_format": {"type": "xml"}}, "response_format"),
    ({"messages": MESSAGES, "response_format": {"type": "json_schema"}}, "response_format"),
    ({"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {"schema": 5}}},
     "response_format"),
    ({"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "frobnicate"}}}}, "response_format"),  # refused by the grammar compiler
    ({"messages": MESSAGES, "structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
    ({"messages": MESSAGES, "structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs"),
    ({"messages": MESSAGES, "structured_outputs": {"structural_tag": "x"}}, "structured_outputs"),
    ({"messages": MESSAGES, "guided_choice": []}, "guided_choice"),
    ({"messages": MESSAGES, "guided_regex": "a+", "response_format": {"type": "json_object"}}, None),
    ({"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),  # auto
    ({"messages": MESSAGES, "tool_choice": "auto"}, "tool_choice"),
    ({"messages": MESSAGES, "tool_choice": "required"}, "tool_choice"),  # no tools
    ({"messages": MESSAGES, "tools": [{"type": "code"}], "tool_choice": "required"}, "tools"),
    ({"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, None),
    ({"messages": [*MESSAGES, {"role": "assistant", "content": None, "function_call": {"name": "f"}}]},
     "messages[1].function_call"),
    ({"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]},
     "messages[1].tool_calls"),
    ({"messages": MESSAGES, "best_of": 3}, "best_of"),
    ({"messages": MESSAGES, "frequency_penalty": 2.5}, "frequency_penalty"),
    ({"messages": MESSAGES, "presence_penalty": "lots"}, "presence_penalty"),
    ({"messages": MESSAGES, "repetition_penalty": 0}, "repetition_penalty"),
    ({"messages": MESSAGES, "logit_bias": {"42": 101}}, "logit_bias"),
    ({"messages": MESSAGES, "logit_bias": {"forty": 1}}, "logit_bias"),
    ({"messages": MESSAGES, "logit_bias": {"999999999": 1}}, "logit_bias"),
    ({"messages": MESSAGES, "logit_bias": {"²": 1}}, "logit_bias"),
    ({"messages": MESSAGES, "max_tokens": 4, "min_tokens": 5}, None),
    ({"messages": MESSAGES, "min_tokens": -1}, "min_tokens"),
    ({"messages": MESSAGES, "min_p": 1.5}, "min_p"),
    ({"messages": MESSAGES, "ignore_eos": "maybe"}, "ignore_eos"),
    ({"messages": MESSAGES, "include_stop_str_in_output": [1]}, "include_stop_str_in_output"),
    ({"messages": MESSAGES, "stream_options": {"include_usage": True}}, None),  # only with stream: true
    ({"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
]

NO_OPS = {"frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": {},
          "response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "user": "u1", "best_of": 1,
          "min_p": 0.0, "min_tokens": 0, "ignore_eos": False, "stop_token_ids": [],
          "include_stop_str_in_output": False, "top_k": -1}


def test_openai_defaults_that_change_nothing_are_accepted(server, sm):
    """What OpenAI (and vLLM) clients send by default passes, and the answer is the greedy answer without them."""
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    plain = post(server, "/v1/chat/completions", body)[1]["choices"][0]["message"]["content"]
    status, out = post(server, "/v1/chat/completions", {**body, **NO_OPS, "model": sm.target.name})
    assert status == 200 and out["choices"][0]["message"]["content"] == plain


def test_a_messages_name_reaches_the_chat_template(server):
    """OpenAI's per-message ``name`` goes to the chat template with the message (as vLLM passes it); a bad one is a
    400."""
    from drafttree.server.requests import parse_messages

    msgs = [{"role": "system", "content": "Be brief.", "name": "rules"},
            {"role": "user", "content": "Hi", "name": "ada"}]
    assert [m.get("name") for m in parse_messages({"messages": msgs})] == ["rules", "ada"]
    status, out = post(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "temperature": 0})
    assert status == 200, out
    for bad in (3, "", ["ada"]):
        status, out = post(server, "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "Hi", "name": bad}], "max_tokens": 2})
        assert status == 400 and out["error"]["param"] == "messages[0].name", (bad, out)


@pytest.mark.parametrize("body,param", BAD)
def test_bad_chat_requests_are_400(server, body, param):
    status, out = post(server, "/v1/chat/completions", body)
    assert status == 400
    err = out["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


@pytest.mark.parametrize("body,param", [({}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"),
                                        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
                                        ({"prompt": "hi", "logprobs": 6}, "logprobs")])  # OpenAI's limit: 5
def test_bad_completion_requests_are_400(server, body, param):
    status, out = post(server, "/v1/completions", body)
    assert status == 400 and out["error"]["param"] == param


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ASK_JSON = [{"role": "user", "content": "Alice is 31. Give her record as JSON."}]


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Oslo, in celsius?"}]


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_tool_calls_for_a_named_function_or_required(server, sm, choice):
    """tool_choice naming a function or "required": the answer is tool_calls (OpenAI's shape, arguments as JSON text
    that parses and fits the schema), the same streamed (one delta with the calls) and not; a follow-up turn that
    carries the calls and the tool's answer is accepted."""
    body = {"messages": ASK_WEATHER, "tools": [WEATHER, TIME], "tool_choice": choice, "max_tokens": 80,
            "temperature": 0}
    status, out = post(server, "/v1/chat/completions", body)
    assert status == 200, out
    ch = out["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
    calls = ch["message"]["tool_calls"]
    assert calls and all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    if isinstance(choice, dict):
        assert [c["function"]["name"] for c in calls] == ["get_weather"]
    args = json.loads(calls[0]["function"]["arguments"])
    if calls[0]["function"]["name"] == "get_weather":
        assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    status, _, data = request(server, "POST", "/v1/chat/completions", {**body, "stream": True})
    events = [json.loads(e) for e in sse_events(data)[:-1]]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert not any(d.get("content") for d in deltas)
    streamed = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [(c["index"], c["function"]) for c in streamed] == [(k, c["function"]) for k, c in enumerate(calls)]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    follow = [*ASK_WEATHER, {"role": "assistant", "content": None, "tool_calls": calls},
              {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"temperature": 4}'}]
    status, out = post(server, "/v1/chat/completions", {"messages": follow, "max_tokens": 8, "temperature": 0})
    assert status == 200 and out["choices"][0]["message"]["content"]


CALL_TEXT = ('Let me check.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
             '</tool_call>')


def streamed_message(server, body) -> tuple[str, list[dict], str]:
    """(content deltas joined, tool-call deltas, finish reason) of a streamed chat request."""
    status, _, data = request(server, "POST", "/v1/chat/completions", {**body, "stream": True})
    assert status == 200
    events = [json.loads(e) for e in sse_events(data)[:-1]]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    return ("".join(d.get("content") or "" for d in deltas), [c for d in deltas for c in d.get("tool_calls", [])],
            events[-1]["choices"][0]["finish_reason"])


def test_tool_choice_auto_reads_the_models_calls(server, monkeypatch):
    """With a tool-call parser (serve --tool-call-parser hermes) tool_choice "auto", the default with tools, returns the
    model's own <tool_call> blocks as tool_calls and its text before them as content; streamed, the text goes out and
    no piece of the call does. The model's answer is made a call by a choice of one string (guided_choice), so the
    test reads the server, not what this small model would choose. A call of a tool not given stays text; so does an
    answer with no call."""
    monkeypatch.setattr(server.server.config.app.state.service, "tool_parser", "hermes")
    body = {"messages": ASK_WEATHER, "tools": [WEATHER, TIME], "guided_choice": [CALL_TEXT], "max_tokens": 80,
            "temperature": 0}
    for extra in ({}, {"tool_choice": "auto"}):
        status, out = post(server, "/v1/chat/completions", {**body, **extra})
        assert status == 200, out
        ch = out["choices"][0]
        assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] == "Let me check."
        (call,) = ch["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
        assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "unit": "celsius"}
    content, calls, finish = streamed_message(server, body)
    assert content == "Let me check." and finish == "tool_calls"
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_weather")]
    other = CALL_TEXT.replace("get_weather", "get_news")
    status, out = post(server, "/v1/chat/completions", {**body, "guided_choice": [other]})
    assert out["choices"][0]["message"] == {"role": "assistant", "content": other}
    assert out["choices"][0]["finish_reason"] == "stop"
    assert streamed_message(server, {**body, "guided_choice": [other]}) == (other, [], "stop")
    plain = {"messages": ASK_WEATHER, "tools": [WEATHER], "max_tokens": 10, "temperature": 0}
    status, out = post(server, "/v1/chat/completions", plain)
    assert status == 200 and "tool_calls" not in out["choices"][0]["message"]
    assert streamed_message(server, plain) == (out["choices"][0]["message"]["content"], [], "length")


@pytest.mark.parametrize("fields,library", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}},
     {"json_schema": SCHEMA}),
    ({"response_format": {"type": "json_object"}}, {"json_schema": True}),
    ({"structured_outputs": {"json": SCHEMA}}, {"json_schema": SCHEMA}),
    ({"guided_json": json.dumps(SCHEMA)}, {"json_schema": SCHEMA}),
    ({"structured_outputs": {"choice": ["31", "thirty-one"]}}, {"choice": ["31", "thirty-one"]}),
    ({"guided_regex": "[0-9]{2} years"}, {"regex": "[0-9]{2} years"}),
])
def test_structured_output_is_the_librarys(server, sm, fields, library):
    """OpenAI's response_format and vLLM's structured_outputs / guided_* give the library's constrained text, streamed
    or not, and a schema's answer parses."""
    body = {"messages": ASK_JSON, "max_tokens": 40, "temperature": 0, **fields}
    status, out = post(server, "/v1/chat/completions", body)
    assert status == 200, out
    text = out["choices"][0]["message"]["content"]
    want = sm.generate(ASK_JSON, max_new_tokens=40, method="ar", **library)
    assert text == want.text
    if "json_schema" in library and out["choices"][0]["finish_reason"] == "stop":
        value = json.loads(text)
        assert library["json_schema"] is True or set(value) == {"name", "age"}
    streamed = stream_text(server, {**body, "stream": True})
    assert streamed == text


def test_malformed_json_and_non_object(server):
    deep = b"[" * 100_000 + b"]" * 100_000  # the parser's recursion limit, well under the size limit
    huge_int = b'{"seed": 1' + b"0" * 5000 + b"}"  # over CPython's 4,300 digits for int()
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe", b"", deep, huge_int):
        status, _, data = request(server, "POST", "/v1/chat/completions", raw=raw)
        assert status == 400, raw
        assert json.loads(data)["error"]["type"] == "invalid_request_error"


def test_prompt_longer_than_context(server, sm):
    ctx = sm.target.context_length
    status, out = post(server, "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hello " * (ctx + 10)}], "max_tokens": 4})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded"
    assert out["error"]["param"] == "messages" and "context window" in out["error"]["message"]


def test_max_tokens_that_overflow_the_context_are_400_and_the_default_shrinks_to_fit(server, sm, monkeypatch):
    """As vLLM and OpenAI: a prompt plus an asked-for max_tokens beyond the context window is refused up front; without
    max_tokens the completion may run to the end of the window (a 64-position window here, so prompts stay short)."""
    monkeypatch.setattr(sm.batch_target().single, "max_positions", 64)
    ids = list(range(1000, 1061))  # 3 positions left
    for key in ("max_tokens", "max_completion_tokens"):
        status, out = post(server, "/v1/completions", {"prompt": ids, key: 4})
        assert status == 400 and out["error"]["code"] == "context_length_exceeded", out
        assert out["error"]["param"] == key and "at most 3 completion tokens fit" in out["error"]["message"]
    status, out = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 3, "temperature": 0})
    assert status == 200 and out["usage"]["prompt_tokens"] == 61 and out["usage"]["completion_tokens"] <= 3
    status, out = post(server, "/v1/completions", {"prompt": ids, "temperature": 0})  # the default, 256, shrunk
    assert status == 200 and out["usage"]["completion_tokens"] <= 3, out


def test_unknown_path_wrong_verb_and_body_too_large(server):
    status, _, data = request(server, "GET", "/v1/nothing")
    assert status == 404 and json.loads(data)["error"]["message"]
    status, headers, data = request(server, "GET", "/v1/chat/completions")
    assert status == 405 and headers["Allow"] == "POST" and json.loads(data)["error"]
    status, _, data = request(server, "DELETE", "/v1/models")
    assert status == 405 and json.loads(data)["error"]["code"] == "method_not_allowed"
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(10**9))  # the server answers from the header, without reading a byte
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 413 and json.loads(r.read())["error"]["code"] == "request_too_large"
    conn.close()


def test_internal_error_is_500_and_server_survives(server, sm, monkeypatch, expected):
    from drafttree.batching import BatchDecoder

    def boom(*args, **kwargs):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(BatchDecoder, "add", boom)
    status, out = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4})
    assert status == 500 and "kaboom" in out["error"]["message"] and out["error"]["type"] == "server_error"
    monkeypatch.undo()
    status, out = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12, "temperature": 0})
    assert status == 200 and out["choices"][0]["message"]["content"] == expected.text


def test_newcomers_are_prefilled_together_and_one_by_one_after_a_failure(server, monkeypatch, expected):
    """Requests that arrive while the model is busy join together (one packed prefill); if that prefill fails, each
    is started alone, so every request still gets its answer."""
    import threading
    import time

    from drafttree.batching import BatchTarget
    from drafttree.server.scheduler import Scheduler

    start_all, prefill_packed = Scheduler._start_all, BatchTarget._prefill_packed
    groups, packed = [], []

    def slow_first(self, jobs):  # the first request of a wave waits, so that the next ones arrive together
        if not groups:
            time.sleep(1.0)
        groups.append(len(jobs))
        return start_all(self, jobs)

    def fail_once(self, ids, need):
        packed.append(len(ids))
        if len(packed) == 1:
            raise RuntimeError("packed prefill failed")
        return prefill_packed(self, ids, need)

    monkeypatch.setattr(Scheduler, "_start_all", slow_first)
    monkeypatch.setattr(BatchTarget, "_prefill_packed", fail_once)
    for _wave in range(2):
        groups.clear()
        results = [None] * 4

        def ask(i, results=results):
            results[i] = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12,
                                                               "temperature": 0})

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        threads[0].start()
        time.sleep(0.3)
        for t in threads[1:]:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert [r[0] for r in results] == [200] * 4
        assert all(r[1]["choices"][0]["message"]["content"] == expected.text for r in results)
        assert max(groups) == 3, groups
    assert packed == [3, 3], "the first wave's packed prefill failed (then one by one), the second's succeeded"


def test_still_serving_after_bad_requests(server, expected):
    post(server, "/v1/chat/completions", {"messages": MESSAGES, "top_p": 7})
    request(server, "POST", "/v1/chat/completions", raw=b"{")
    status, out = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12, "temperature": 0})
    assert status == 200 and out["choices"][0]["message"]["content"] == expected.text
    assert request(server, "GET", "/health")[0] == 200


def test_keep_alive_connection_serves_several_requests(server, expected):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    for stream in (False, True, False):
        body = json.dumps({"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": stream})
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        assert r.status == 200
        if not stream:
            assert json.loads(data)["choices"][0]["message"]["content"] == expected.text
        else:
            assert sse_events(data)[-1] == "[DONE]"
    conn.close()


def test_client_disconnect_mid_stream_frees_the_model(server, expected):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/v1/chat/completions",
                 json.dumps({"messages": MESSAGES, "max_tokens": 64, "temperature": 0, "stream": True}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.fp.readline()  # the first chunk's size line: streaming has started
    conn.sock.close()
    conn.close()
    status, out = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12, "temperature": 0})
    assert status == 200 and out["choices"][0]["message"]["content"] == expected.text


def test_client_disconnect_while_waiting_for_a_whole_answer_frees_the_row(server):
    """A non-streaming request whose client goes away leaves the batch within about a second, although its row sends
    an event every round (the check runs on the clock)."""
    import time

    host, port = server.server_address[:2]
    scheduler = server.server.config.app.state.service.scheduler
    served = scheduler.served
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 4000,
                                                        "temperature": 0, "method": "ar"}),
                 {"Content-Type": "application/json"})
    deadline = time.monotonic() + 30
    while scheduler.load()["rows"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scheduler.load()["rows"] == 1
    time.sleep(0.5)
    conn.sock.shutdown(2)
    conn.close()
    left = time.monotonic()
    while scheduler.load()["rows"] and time.monotonic() < left + 20:
        time.sleep(0.05)
    assert scheduler.load()["rows"] == 0 and time.monotonic() - left < 5
    assert scheduler.served == served  # cancelled, not answered


def test_health_is_503_when_the_decode_loop_has_stopped(sm):
    srv = ServerThread(create_app(sm)).start()
    try:
        srv.server.config.app.state.service.scheduler.stop()  # as if the loop's thread had died
        status, _, data = request(srv, "GET", "/health")
        assert status == 503 and json.loads(data)["status"] == "error"
    finally:
        srv.stop()


def test_web_page(server):
    status, headers, data = request(server, "GET", "/")
    page = data.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "/v1/drafttree/methods" in page and "/v1/chat/completions" in page and "getReader" in page
    assert "<script" in page and "http://" not in page and "https://" not in page  # self-contained


def test_serve_subcommand_is_registered():
    from drafttree.cli import build_parser

    args = build_parser().parse_args(["serve", "--port", "0", "--method", "lookup", "--dtype", "float32"])
    assert args.port == 0 and args.method == "lookup" and args.host == "127.0.0.1" and callable(args.func)


@pytest.mark.parametrize("argv,msg", [
    (["--prefix-cache-tokens", "100"], "it needs --enable-prefix-caching"),
    (["--enable-prefix-caching", "--prefix-cache-tokens", "0"], "--prefix-cache-tokens must be > 0"),
])
def test_serve_prefix_cache_flags_fail_before_loading(capsys, argv, msg):
    from drafttree.cli import main

    assert main(["serve", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def test_other_commands_work_without_the_web_stack_and_serve_names_what_is_missing():
    import subprocess
    import sys

    code = ("import sys\n"
            "sys.modules['fastapi'] = None  # as if not installed\n"
            "from drafttree.cli import build_parser, main\n"
            "build_parser().parse_args(['train', '--features', 'f', '--out', 'o'])\n"
            "sys.exit(main(['serve', '--port', '0']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "drafttree: error: drafttree serve needs fastapi" in r.stderr and "pip install" in r.stderr


def test_serving_freezes_what_is_loaded_and_still_collects_the_rounds_garbage():
    """``drafttree serve`` exempts the loaded model's objects from full collections (each walked ~400k of them, a
    stall of every stream); cycles made afterwards are still collected."""
    import gc

    from drafttree.server.run import freeze_loaded_objects

    class Node:
        pass

    loaded = Node()
    loaded.me = loaded
    try:
        freeze_loaded_objects()
        assert gc.get_freeze_count() > 0
        assert not any(o is loaded for o in gc.get_objects())  # frozen: no longer tracked by the collector's passes
        garbage = Node()
        garbage.me = garbage
        del garbage
        assert gc.collect() > 0
    finally:
        gc.unfreeze()


def test_logprobs_in_openai_shapes(server, sm, expected):
    status, out = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12, "temperature": 0,
                                                        "logprobs": True, "top_logprobs": 2})
    assert status == 200
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == len([t for t in expected.tokens if t not in sm.eos_ids])  # EOS is not reported
    want = sm.generate(MESSAGES, max_new_tokens=12, logprobs=2).logprobs
    for item, e in zip(content, want):
        assert item["token"] == sm.tokenizer.decode([e.token]) and item["bytes"] == list(item["token"].encode())
        assert abs(item["logprob"] - e.logprob) < 1e-3 and len(item["top_logprobs"]) == 2
    assert "".join(i["token"] for i in content if i["token"] not in sm.tokenizer.all_special_tokens) == expected.text
    status, headers, data = request(server, "POST", "/v1/chat/completions", {  # streamed: the same entries, in pieces
        "messages": MESSAGES, "max_tokens": 12, "temperature": 0, "logprobs": True, "stream": True})
    pieces = [json.loads(e)["choices"][0]["logprobs"] for e in sse_events(data)[:-1]]
    streamed = [i for p in pieces if p for i in p["content"]]
    assert [i["token"] for i in streamed] == [i["token"] for i in content]
    assert all(i["top_logprobs"] == [] for i in streamed)
    status, out = post(server, "/v1/completions", {"prompt": "The three primary colours are", "max_tokens": 8,
                                                   "temperature": 0, "logprobs": 0, "stop": "\n\n"})
    lp = out["choices"][0]["logprobs"]
    assert status == 200 and len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"])
    assert lp["top_logprobs"] == [{}] * len(lp["tokens"]) and lp["text_offset"][0] == 0
    assert "".join(lp["tokens"]).startswith(out["choices"][0]["text"])  # a stop string: tokens up to it only
    assert len(lp["tokens"]) <= out["usage"]["completion_tokens"]
    assert lp["text_offset"] == sorted(lp["text_offset"])
    status, headers, data = request(server, "POST", "/v1/completions", {  # streamed with the stop string held back
        "prompt": "The three primary colours are", "max_tokens": 8, "temperature": 0, "logprobs": 0, "stop": "\n\n",
        "stream": True})
    pieces = [json.loads(e)["choices"][0]["logprobs"] for e in sse_events(data)[:-1]]
    assert [t for p in pieces if p for t in p["tokens"]] == lp["tokens"]
    assert [o for p in pieces if p for o in p["text_offset"]] == lp["text_offset"]
    status, out = post(server, "/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2})
    assert status == 400 and "top_logprobs needs logprobs" in out["error"]["message"]


def test_logprob_bytes_spell_characters_split_over_tokens(sm):
    """OpenAI's ``bytes``: a token holding part of a UTF-8 character gives its own bytes (not U+FFFD's), so joining
    them rebuilds the text."""
    from drafttree.server.app import token_bytes

    tok = sm.tokenizer
    for text in ("😀 ok", "日本語", "héllo", " plain"):
        ids = tok(text, add_special_tokens=False).input_ids
        pieces = [token_bytes(tok, t, tok.decode([t])) for t in ids]
        assert bytes(b for p in pieces for b in p).decode("utf-8") == text
    assert any(len(tok.decode([t])) == 1 and tok.decode([t]) == "\ufffd"
               for t in tok("😀", add_special_tokens=False).input_ids)  # the case this is for


def test_usage_and_tokens_stop_at_a_stop_string_whatever_the_method(server, sm):
    """Tokens accepted past a stop string (a drafter may have proposed them) are not counted: every method reports
    the same completion tokens, and the library returns the same tokens."""
    messages = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    usages, texts = [], []
    for method in ("ar", "lookup"):
        status, out = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 60, "temperature": 0,
                                                            "stop": ["7"], "method": method, "logprobs": True})
        assert status == 200 and out["choices"][0]["finish_reason"] == "stop"
        usages.append(out["usage"]["completion_tokens"])
        texts.append(out["choices"][0]["message"]["content"])
        assert len(out["choices"][0]["logprobs"]["content"]) == usages[-1]
    assert usages[0] == usages[1] and texts[0] == texts[1]
    results = [sm.generate(messages, max_new_tokens=60, stop=["7"], method=m) for m in ("ar", "lookup")]
    assert results[0].tokens == results[1].tokens and results[0].new_tokens == len(results[0].tokens) == usages[0]
    stream = sm.stream(messages, max_new_tokens=60, stop=["7"], method="lookup")
    assert [t for chunk in stream for t in chunk.tokens] == results[0].tokens
    got = []
    for method in ("ar", "lookup"):  # a stop string over two tokens ("\n", "7"): the first is held back, never out
        stream = sm.stream(messages, max_new_tokens=60, stop=["\n7"], method=method, logprobs=0)
        chunks = list(stream)
        assert stream.result.finish_reason == "stop" and "\n7" not in stream.result.text
        assert [t for c in chunks for t in c.tokens] == stream.result.tokens
        assert [e.token for c in chunks for e in c.logprobs] == stream.result.tokens
        assert sm.tokenizer.decode(stream.result.tokens) == stream.result.text
        got.append(stream.result.tokens)
    assert got[0] == got[1] and len(got[0]) < len(results[0].tokens)
    per_row = {0: [], 1: []}  # the same in a batch, row by row
    for i, chunk in sm.stream_batch([messages, messages], 60, stop=["\n7"], method="lookup"):
        per_row[i] += chunk.tokens
    assert [r.tokens for r in sm.batch_results()] == [per_row[0], per_row[1]] == [got[0], got[0]]
    assert sm.tokenizer.decode(results[0].tokens[:-1]).find("7") < 0  # the last token kept is where "7" starts


def test_vllm_end_options_ignore_eos_stop_token_ids_and_include_stop(server, sm):
    """vLLM's ignore_eos (what `vllm bench serve` and other load generators send), stop_token_ids and
    include_stop_str_in_output: the library's answers, in OpenAI's shapes; bad ids are a 400."""
    short = [{"role": "user", "content": "Reply with just the word: yes"}]
    want = sm.generate(short, max_new_tokens=24, method="ar", ignore_eos=True)
    status, out = post(server, "/v1/chat/completions", {"messages": short, "max_tokens": 24, "temperature": 0,
                                                         "ignore_eos": True, "logprobs": True})
    assert status == 200 and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 24 == len(out["choices"][0]["logprobs"]["content"])
    assert out["choices"][0]["message"]["content"] == want.text
    stop_id = want.tokens[1]
    status, out = post(server, "/v1/chat/completions", {"messages": short, "max_tokens": 24, "temperature": 0,
                                                         "stop_token_ids": [stop_id]})
    assert status == 200 and out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == want.tokens.index(stop_id) + 1
    count = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    status, out = post(server, "/v1/chat/completions", {"messages": count, "max_tokens": 60, "temperature": 0,
                                                         "stop": ["7"], "include_stop_str_in_output": True})
    text = out["choices"][0]["message"]["content"]
    assert status == 200 and text.endswith("7") and "6" in text
    for bad in ([-1], [sm.target.vocab_size], ["x"], 5):
        status, out = post(server, "/v1/chat/completions", {"messages": short, "max_tokens": 2, "stop_token_ids": bad})
        assert status == 400 and out["error"]["param"].startswith("stop_token_ids"), (bad, out)


def test_n_choices_stream_interleaved_each_chunk_naming_its_index(server):
    """stream with n > 1, as OpenAI and vLLM stream it: chunks of every choice interleave, each names its index;
    each choice's text is the non-streamed answer's; one finish chunk per choice; the usage chunk counts the prompt
    once."""
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 1.0, "seed": 21, "n": 3}
    status, whole = post(server, "/v1/chat/completions", body)
    assert status == 200
    status, _, data = request(server, "POST", "/v1/chat/completions",
                              {**body, "stream": True, "stream_options": {"include_usage": True}})
    events = sse_events(data)
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts, finishes, roles = {0: "", 1: "", 2: ""}, {}, {}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        i = choice["index"]
        roles.setdefault(i, choice["delta"].get("role"))
        texts[i] += choice["delta"].get("content", "")
        if choice["finish_reason"] is not None:
            assert i not in finishes
            finishes[i] = choice["finish_reason"]
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"} and sorted(finishes) == [0, 1, 2]
    assert [texts[i] for i in range(3)] == [c["message"]["content"] for c in whole["choices"]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


def test_penalties_biases_and_min_p_are_the_librarys(server, sm):
    """OpenAI's presence / frequency penalties and logit_bias, vLLM's repetition_penalty, min_p and min_tokens: the
    library's answer for the same settings (each method exact for the adjusted distribution: test_penalties.py)."""
    settings = {"frequency_penalty": 1.0, "presence_penalty": 0.5, "repetition_penalty": 1.2, "min_tokens": 10,
                "logit_bias": {"13": 3.0}}
    want = sm.generate(MESSAGES, max_new_tokens=16, **{**settings, "logit_bias": {13: 3.0}})
    status, out = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 16, "temperature": 0,
                                                         **settings})
    assert status == 200 and out["choices"][0]["message"]["content"] == want.text
    assert want.text != sm.generate(MESSAGES, max_new_tokens=16).text
    sampled = {"messages": MESSAGES, "max_tokens": 12, "temperature": 1.0, "seed": 3, "min_p": 0.1}
    want = sm.generate(MESSAGES, max_new_tokens=12, temperature=1.0, seed=3, min_p=0.1)
    status, out = post(server, "/v1/chat/completions", sampled)
    assert status == 200 and out["choices"][0]["message"]["content"] == want.text


def test_metrics_count_requests_tokens_and_accepted_drafts(server, sm):
    """GET /metrics in Prometheus' text format: the counters move by what a request used."""
    def scrape() -> dict:
        status, headers, data = request(server, "GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain")
        values = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name.split("{")[0] + ("[stop]" if 'finished_reason="stop"' in name else "")
                       + ("[length]" if 'finished_reason="length"' in name else "")] = float(value)
        return values

    before = scrape()
    status, out = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 7, "temperature": 0})
    assert status == 200
    after = scrape()
    usage = out["usage"]
    assert after["drafttree_prompt_tokens_total"] - before["drafttree_prompt_tokens_total"] == usage["prompt_tokens"]
    assert (after["drafttree_generation_tokens_total"] - before["drafttree_generation_tokens_total"]
            == usage["completion_tokens"])
    forwards = after["drafttree_target_forwards_total"] - before["drafttree_target_forwards_total"]
    assert forwards == out["drafttree"]["target_forwards"]
    finished = out["choices"][0]["finish_reason"]
    assert after[f"drafttree_request_success_total[{finished}]"] - before.get(
        f"drafttree_request_success_total[{finished}]", 0) == 1
    assert after["drafttree_e2e_request_latency_seconds_count"] > before["drafttree_e2e_request_latency_seconds_count"]
    assert after["drafttree_time_to_first_token_seconds_sum"] > before["drafttree_time_to_first_token_seconds_sum"]
    assert after["drafttree_num_requests_running"] == 0
    bad = after["drafttree_request_failure_total"]
    post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "stop_token_ids": [-1]})  # a 400
    assert scrape()["drafttree_request_failure_total"] == bad  # refused before it was queued: not a failure


def test_tokenize_and_detokenize(server, sm):
    status, out = post(server, "/tokenize", {"messages": MESSAGES})
    assert status == 200 and out["tokens"] == sm.encode_prompt(MESSAGES, chat=True).tolist()
    assert out["count"] == len(out["tokens"]) and out["max_model_len"] == sm.batch_target().max_positions
    status, raw = post(server, "/tokenize", {"prompt": "The capital of France"})
    assert status == 200 and raw["tokens"] == sm.encode_prompt("The capital of France", chat=False).tolist()
    status, back = post(server, "/detokenize", {"tokens": raw["tokens"]})
    assert status == 200 and back["prompt"] == "The capital of France"
    for path, body in (("/tokenize", {}), ("/tokenize", {"prompt": 5}), ("/tokenize", {"prompt": "a", "messages": []}),
                       ("/tokenize", {"messages": "hi"}), ("/detokenize", {"tokens": [-1]}),
                       ("/detokenize", {"tokens": "abc"}), ("/detokenize", [1, 2])):
        status, out = post(server, path, body)
        assert status == 400 and out["error"]["type"] == "invalid_request_error", (path, body, out)


@pytest.mark.parametrize("logprobs", [None, 1])
def test_a_retried_prefill_keeps_each_requests_end_tokens(sm, logprobs):
    """When the packed prefill of newcomers fails and each starts alone, each keeps its own end tokens (a
    stop_token_ids request still stops there; with logprobs too)."""
    import asyncio

    from drafttree.server.scheduler import Job, Scheduler

    ids = sm.prompt_ids("Reply with just the word: yes", True)
    plain = sm.generate(ids, max_new_tokens=24, method="ar", ignore_eos=True).tokens
    stop = plain[1]
    ends = sm.end_ids([stop], ignore_eos=True)

    async def main():
        loop = asyncio.get_running_loop()
        sched = Scheduler(sm, max_batch=4)
        real, calls = sched.decoder.add_many, []

        def flaky(seqs):
            calls.append(len(seqs))
            if len(calls) == 1 and len(seqs) > 1:
                raise RuntimeError("the packed prefill failed")
            return real(seqs)

        sched.decoder.add_many = flaky
        jobs = [Job(ids, "ar", sm.sampling(), 24, [], i, loop, logprobs=logprobs, end_ids=ends) for i in range(2)]
        with sched.cond:  # both join the same round
            for job in jobs:
                sched.submit(job)
        outs = []
        for job in jobs:
            event = await job.events.get()
            while event[0] == "chunk":
                event = await job.events.get()
            outs.append(event)
        sched.stop()
        return calls, outs

    calls, outs = asyncio.run(main())
    assert calls[0] == 2 and len(calls) > 1
    for event in outs:
        assert event[0] == "done", event
        assert event[1]["finish_reason"] == "stop" and event[1]["completion_tokens"] == plain.index(stop) + 1


def test_prefix_caching_serves_a_chats_next_turn_from_its_last_one(default_fp32, sm):
    """``--enable-prefix-caching``: a conversation's next turn reuses the keys of the turn before it and its answer
    (usage says how many, as OpenAI's ``prompt_tokens_details.cached_tokens``); the answers are those without it."""
    cached = SpeculativeModel(default_fp32, method="lookup", prefix_cache=True)
    srv = ServerThread(create_app(cached)).start()
    try:
        messages = list(MESSAGES)
        for turn in ("Which one is your favourite?", "Say it in French."):
            status, body = post(srv, "/v1/chat/completions", {"messages": messages, "max_tokens": 12, "temperature": 0})
            assert status == 200
            answer = body["choices"][0]["message"]["content"]
            assert answer == sm.generate(messages, max_new_tokens=12).text
            cached_tokens = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert (cached_tokens > len(messages) * 4) if len(messages) > 1 else cached_tokens == 0
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": turn}]
        status, _, text = request(srv, "GET", "/metrics")
        line = [x for x in text.decode().splitlines() if x.startswith("drafttree_prompt_tokens_cached_total")]
        assert status == 200 and float(line[0].split()[-1]) == cached_tokens > 0
    finally:
        srv.stop()
