"""``drafttree serve``'s OpenAI options on the real default model (float32, prompt lookup): n choices, logprobs, tool
calls, structured output, stop strings and vLLM's end options, penalties and biases, metrics, tokenize, prefix caching.
Routes, validation and errors: test_server.py."""

from __future__ import annotations

import json

import pytest
from server_client import MESSAGES, post, request, sse_events, stream_text

from drafttree import SpeculativeModel
from drafttree.server import ServerThread, create_app


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


def test_completions_take_a_batch_of_prompts(server):
    """/v1/completions with a list of prompts (strings or token-id lists), as OpenAI and vLLM take it: n choices per
    prompt, choice k * n + j for prompt k, each what that prompt alone gives with seed + its index; usage counts each
    prompt once; streamed, every choice's chunks name their index and the usage chunk is the same."""
    a, b = "The capital of France is", "Once upon a time"
    ids_b = post(server, "/tokenize", {"prompt": b})[1]["tokens"]
    body = {"prompt": [a, ids_b], "max_tokens": 6, "temperature": 1.0, "seed": 5, "n": 2}
    status, out = post(server, "/v1/completions", body)
    assert status == 200 and [c["index"] for c in out["choices"]] == [0, 1, 2, 3], out
    alone = [post(server, "/v1/completions", {**body, "prompt": p, "n": 1, "seed": 5 + i})[1]
             for i, p in enumerate([a, a, b, b])]
    assert [c["text"] for c in out["choices"]] == [x["choices"][0]["text"] for x in alone]
    assert out["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"] + alone[2]["usage"]["prompt_tokens"]
    assert out["usage"]["completion_tokens"] == sum(x["usage"]["completion_tokens"] for x in alone)
    status, _, data = request(server, "POST", "/v1/completions",
                              {**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in sse_events(data)[:-1]]
    texts = {i: "" for i in range(4)}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        texts[choice["index"]] += choice["text"] or ""
    assert [texts[i] for i in range(4)] == [c["text"] for c in out["choices"]]
    assert chunks[-1]["usage"] == out["usage"]
    for bad, where in [([a, ""], "prompt 1 is empty"), ([a, 5], "'prompt' must be"), ([], "'prompt' must be"),
                       ([a, [10**9]], "prompt 1: token ids must be in")]:
        status, out = post(server, "/v1/completions", {"prompt": bad, "max_tokens": 2})
        assert status == 400 and where in out["error"]["message"], out


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
