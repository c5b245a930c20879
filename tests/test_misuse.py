"""What a user does wrong, on the real default model (float32): generations that overlap on one model (a stream left
open, a batch abandoned, two threads) never decode from caches another generation rewrote, and bad arguments get a
one-line DraftTreeError before anything runs (not a TypeError from deep inside, nor a value silently misread)."""

from __future__ import annotations

import json
import threading

import pytest
from server_client import MESSAGES, post, request

from drafttree import SpeculativeModel
from drafttree.errors import DraftTreeError

COUNT, HI, STORY, PLANETS = "Count from 1 to 30.", "Say hi.", "Write a long story about a dragon.", "Name planets."


@pytest.fixture(scope="module")
def lm(default_fp32):
    return SpeculativeModel(default_fp32, method="lookup")


def text(lm, prompt, n=16, **kw):
    return lm.generate(prompt, max_new_tokens=n, **kw).text


def test_generate_while_a_stream_is_open_interrupts_the_stream(lm):
    ref_hi = text(lm, HI)
    s = lm.stream(COUNT, max_new_tokens=24)
    next(s)
    assert text(lm, HI) == ref_hi  # the new generation decodes as on a fresh model
    with pytest.raises(DraftTreeError, match="interrupted"):
        next(s)  # and the open stream says so instead of reading the other generation's caches
    with pytest.raises(StopIteration):
        next(s)  # once


def test_of_two_open_streams_the_later_one_runs_on(lm):
    ref = text(lm, PLANETS, 20)
    first, second = lm.stream(COUNT, max_new_tokens=20), lm.stream(PLANETS, max_new_tokens=20)
    next(first)
    chunks = [next(second)]
    with pytest.raises(DraftTreeError, match="interrupted"):
        next(first)
    chunks += list(second)
    assert "".join(c.text for c in chunks) == ref == second.result.text


def test_a_stream_read_to_its_end_leaves_the_model_free(lm):
    ref = text(lm, COUNT)
    s = lm.stream(COUNT, max_new_tokens=16)
    assert "".join(c.text for c in s) == ref
    assert text(lm, HI) == text(lm, HI)
    s.close()  # closing a finished stream is harmless


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_an_abandoned_batch_does_not_leak_into_the_next(default_fp32, prefix_cache):
    lm = SpeculativeModel(default_fp32, method="lookup", prefix_cache=prefix_cache)
    ref = [r.text for r in lm.generate([COUNT, HI], max_new_tokens=16)]
    for _, chunk in lm.stream_batch([STORY, PLANETS], max_new_tokens=32):
        if chunk.text:
            break  # rows left in the batched cache
    assert [r.text for r in lm.generate([COUNT, HI], max_new_tokens=16)] == ref


def test_threads_take_turns(lm):
    prompts = [PLANETS, COUNT, HI]
    ref = [text(lm, p) for p in prompts]
    got: dict[int, str] = {}
    errors: list[BaseException] = []

    def work(i):
        try:
            got[i] = text(lm, prompts[i])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and [got[i] for i in range(len(prompts))] == ref


@pytest.mark.parametrize("kwargs, match", [
    ({"max_new_tokens": 3.5}, "max_new_tokens must be a positive integer"),
    ({"max_new_tokens": "4"}, "max_new_tokens must be a positive integer"),
    ({"max_new_tokens": float("inf")}, "max_new_tokens must be a positive integer"),
    ({"max_new_tokens": float("nan")}, "max_new_tokens must be a positive integer"),
    ({"max_new_tokens": True}, "max_new_tokens must be a positive integer"),
    ({"method_options": [1]}, "method_options must be a dict"),
    ({"method_options": "depth=3"}, "method_options must be a dict"),
    ({"method": "hybrid", "method_options": {"depth": None}}, "depth must be given a value"),
    ({"method": "lookup", "method_options": {"num_tokens": None}}, "num_tokens must be given a value"),
    ({"method": "hybrid", "method_options": {"explore": float("nan")}}, "explore must be a number"),
    ({"stop": 5}, "stop must be a string or a list of strings"),
    ({"stop": [5]}, "stop must be a string or a list of strings"),
    ({"stop": {"a": 1}}, "stop must be a string or a list of strings"),
    ({"stop": ["\ud800"]}, "not valid Unicode"),
    ({"stop_token_ids": {1: 2}}, "stop_token_ids must be a token id or a list"),
    ({"include_stop": "no"}, "include_stop must be true or false"),
    ({"chat": "no"}, "chat must be true or false"),
])
def test_bad_arguments_are_one_line_errors(lm, kwargs, match):
    kw = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(DraftTreeError, match=match):
        lm.generate(HI, **kw)


@pytest.mark.parametrize("kwargs, match", [
    ({"max_new_tokens": 2.5}, "max_new_tokens must be a positive integer"),
    ({"max_batch": "2"}, "max_batch must be a positive integer"),
    ({"max_batch": 1.5}, "max_batch must be a positive integer"),
    ({"method_options": [1]}, "method_options must be a dict"),
])
def test_bad_batch_arguments_are_one_line_errors(lm, kwargs, match):
    with pytest.raises(DraftTreeError, match=match):
        lm.generate([HI, COUNT], **{"max_new_tokens": 4, **kwargs})


@pytest.mark.parametrize("prompt, match", [
    ("\ud800 hi", r"the prompt is not valid Unicode text: '\\ud800' at character 0"),
    ([{"role": "user", "content": "caf\udce9"}], r"messages\[0\].content is not valid Unicode"),
    ([{"role": "user", "content": None}], r"messages\[0\].content must be a string or a list of text parts"),
    ([{"role": "user", "content": 5}], r"messages\[0\].content must be a string"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], r"messages\[0\].content"),
    (5, "a prompt must be text, token ids or a non-empty list"),
])
def test_bad_prompts_are_one_line_errors(lm, prompt, match):
    with pytest.raises(DraftTreeError, match=match):
        lm.generate(prompt, max_new_tokens=4)


def test_content_parts_are_text_as_on_the_server(lm):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi."}]}]
    assert text(lm, parts) == text(lm, [{"role": "user", "content": HI}])


@pytest.mark.parametrize("tree, match", [([[0, 0]], r"path \[0, 0\] has no parent path \[0\]"),
                                         ([[100000]], "child index 100000")])
def test_bad_static_trees_are_one_line_errors(tree, match):
    from drafttree.drafters.options import EagleOptions, parse_options

    with pytest.raises(DraftTreeError, match=match):
        parse_options(EagleOptions, "eagle1", {"tree": tree})


def test_server_refuses_text_that_is_not_unicode(server):
    for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800 hi"}]}),
                       ("/v1/completions", {"prompt": "\ud800 hi"})]:
        status, out = post(server, path, {**body, "max_tokens": 4})
        assert status == 400 and "not valid Unicode" in out["error"]["message"], out


def test_server_answers_n_it_can_never_queue_with_400(sm):
    from drafttree.server import ServerThread, create_app

    srv = ServerThread(create_app(sm, max_batch=1, max_queue=1)).start()
    try:
        status, out = post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "n": 2})
        assert status == 400 and out["error"]["param"] == "n" and "--max-queue" in out["error"]["message"]
        status, out = post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "n": 1})
        assert status == 200 and out["choices"][0]["message"]["content"]
        status, headers, data = request(srv, "HEAD", "/health")
        assert status == 200 and not data
        assert json.loads(request(srv, "GET", "/health")[2])["status"] == "ok"
    finally:
        srv.stop()
