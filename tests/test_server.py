"""``drafttree serve``: the OpenAI-compatible server (FastAPI + uvicorn, batched decoding) on the real default model
(float32, prompt lookup): routes, validation, errors, disconnects, the web page. The OpenAI options it implements
(logprobs, tools, structured output, stop strings, penalties, n choices, metrics, prefix caching):
test_server_openai.py; the shared client: server_client.py."""

from __future__ import annotations

import http.client
import json

import pytest
from server_client import MESSAGES, post, request, sse_events

from drafttree.server import ServerThread, create_app


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

@pytest.mark.parametrize("body,param", BAD)
def test_bad_chat_requests_are_400(server, body, param):
    status, out = post(server, "/v1/chat/completions", body)
    assert status == 400
    err = out["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


@pytest.mark.parametrize("body,param", [({}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": ["a", 5]}, "prompt"),
                                        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
                                        ({"prompt": "hi", "logprobs": 6}, "logprobs")])  # OpenAI's limit: 5
def test_bad_completion_requests_are_400(server, body, param):
    status, out = post(server, "/v1/completions", body)
    assert status == 400 and out["error"]["param"] == param


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

    def fail_once(self, ids, need):  # the first packed prefill of several prompts fails
        if len(ids) > 1:  # (a lone newcomer that shares the system prompt with a running row is packed alone)
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
    (["--prefill-chunk", "-1"], "prefill_chunk must be a number of tokens >= 0"),
])
def test_serve_flags_fail_before_loading(capsys, argv, msg):
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
