"""The server under load (loopback, real default model, float32, the shipped head: method auto): 100 concurrent
streaming requests, clients that disconnect mid-stream, malformed and oversized bodies interleaved, a full
queue answered 503, an API key enforced."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from drafttree import SpeculativeModel
from drafttree.server import ServerThread, create_app

QUESTIONS = ["Name a fruit.", "What is 2 + 2?", "Say hello in Spanish.", "Name a planet.", "What colour is the sky?",
             "Give me a synonym for fast.", "Name an ocean.", "What is the capital of France?"]
MAX_TOKENS = 6
KEY = "test-key-123"


@pytest.fixture(scope="module")
def sm(default_fp32):
    from drafttree.heads import load_head_for

    return SpeculativeModel(default_fp32, head=load_head_for(default_fp32))


@pytest.fixture(scope="module")
def alone(sm):
    """Each question served alone, through the single-sequence decoder (the reference)."""
    return {q: sm.generate(q, max_new_tokens=MAX_TOKENS).text for q in QUESTIONS}


@pytest.fixture(scope="module")
def server(sm):
    srv = ServerThread(create_app(sm, api_key=KEY, max_batch=16, max_queue=200, max_body_bytes=64 * 1024)).start()
    yield srv
    srv.stop()


AUTH = {"Authorization": f"Bearer {KEY}"}


async def _stream(client: httpx.AsyncClient, q: str) -> tuple[str, list[str]]:
    body = {"messages": [{"role": "user", "content": q}], "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    events = []
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    return text, events


async def _disconnect(client: httpx.AsyncClient) -> None:
    body = {"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 200, "temperature": 0,
            "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                break  # the first event arrived: leave mid-stream


async def _bad(client: httpx.AsyncClient, i: int) -> int:
    if i % 3 == 0:
        r = await client.post("/v1/chat/completions", content=b"{not json", headers=AUTH)
    elif i % 3 == 1:
        r = await client.post("/v1/chat/completions", content=b"x" * (65 * 1024), headers=AUTH)
    else:
        r = await client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 3}, headers=AUTH)
    return r.status_code


def test_100_concurrent_streams_with_disconnects_and_bad_requests(server, alone):
    async def main():
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=server.url.rstrip("/"), timeout=600, limits=limits) as client:
            jobs = [_stream(client, QUESTIONS[i % len(QUESTIONS)]) for i in range(100)]
            jobs += [_disconnect(client) for _ in range(5)] + [_bad(client, i) for i in range(9)]
            return await asyncio.gather(*jobs)

    out = asyncio.run(main())
    streams, bad = out[:100], out[105:]
    for i, (text, events) in enumerate(streams):
        assert events[-1] == "[DONE]", f"stream {i} did not end with [DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
        assert text == alone[QUESTIONS[i % len(QUESTIONS)]], f"stream {i} differs from the request served alone"
    assert bad == [400, 413, 400] * 3
    with httpx.Client(base_url=server.url.rstrip("/"), timeout=60) as c:
        health = c.get("/health").json()
        assert health["status"] == "ok" and health["rows"] == 0 and health["waiting"] == 0
        r = c.post("/v1/chat/completions", headers=AUTH, json={"messages": [{"role": "user", "content": QUESTIONS[0]}],
                                                               "max_tokens": MAX_TOKENS, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == alone[QUESTIONS[0]]


def test_long_prompts_join_a_chunk_a_round_and_every_stream_is_exact(sm, alone, monkeypatch):
    """With a small prefill budget (prefill_chunk, batching/admission.py), long prompts that arrive while a request
    streams are prefilled a chunk a round (two clients disconnect meanwhile): every stream ends with [DONE] and equals
    its request served alone."""
    from drafttree.batching.admission import PromptInChunks

    chunks = []
    real = PromptInChunks.advance
    monkeypatch.setattr(PromptInChunks, "advance", lambda self, n: (chunks.append(n), real(self, n)))
    long_qs = [f"Here is a note, number {i}: " + "the keeper climbed the hundred steps and lit the lamp. " * (6 + 3 * i)
               + "What did the keeper do?" for i in range(3)]
    want = {q: sm.generate(q, max_new_tokens=MAX_TOKENS).text for q in long_qs}
    first = sm.generate(QUESTIONS[0], max_new_tokens=40).text
    sm.prefill_chunk = 24
    try:
        srv = ServerThread(create_app(sm, api_key=KEY, max_batch=8, max_queue=50)).start()
    finally:
        sm.prefill_chunk = 512  # the app's scheduler took it when it was made

    async def anchor(client, started):
        body = {"messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": 40, "temperature": 0,
                "stream": True}
        text = ""
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    started.set()
                    text += json.loads(line[len("data: "):])["choices"][0]["delta"].get("content", "")
        return text

    async def main():
        async with httpx.AsyncClient(base_url=srv.url.rstrip("/"), timeout=600) as client:
            started = asyncio.Event()
            running = asyncio.create_task(anchor(client, started))
            await started.wait()  # a row decodes: newcomers now wait for the rounds' prefill budget
            jobs = [_stream(client, q) for q in long_qs + QUESTIONS[1:4]] + [_disconnect(client) for _ in range(2)]
            return await running, await asyncio.gather(*jobs)

    try:
        text0, out = asyncio.run(main())
        assert text0 == first
        for q, (text, events) in zip(long_qs + QUESTIONS[1:4], out):
            assert events[-1] == "[DONE]"
            assert text == (want[q] if q in want else alone[q])
        assert len(chunks) >= 2 and chunks[0] <= 24  # in chunks (what is left once no row decodes: at once)
        with httpx.Client(base_url=srv.url.rstrip("/"), timeout=60) as c:
            health = c.get("/health").json()
            assert health["rows"] == 0 and health["waiting"] == 0
    finally:
        srv.stop()


def test_api_key_is_enforced(server):
    with httpx.Client(base_url=server.url.rstrip("/"), timeout=60) as c:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = c.post("/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert c.get("/v1/models").status_code == 401
        assert c.get("/health").status_code == 200 and c.get("/").status_code == 200  # page and probe stay open
        assert c.get("/docs").status_code == 200 and "/v1/chat/completions" in c.get("/openapi.json").text


def test_full_queue_answers_503_with_retry_after(sm):
    """One row decoding, one request waiting: the queue (1) is full, the next ones get 503 + Retry-After."""
    srv = ServerThread(create_app(sm, max_batch=1, max_queue=1)).start()
    try:
        async def main():
            async with httpx.AsyncClient(base_url=srv.url.rstrip("/"), timeout=600) as client:
                body = {"messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 40,
                        "temperature": 0}
                first = asyncio.create_task(client.post("/v1/chat/completions", json=body))
                while (await client.get("/health")).json().get("rows") != 1:  # the first one is decoding
                    await asyncio.sleep(0.02)
                second = asyncio.create_task(client.post("/v1/chat/completions", json=body))
                while (await client.get("/health")).json().get("waiting") != 1:  # the second one waits
                    await asyncio.sleep(0.02)
                rest = await asyncio.gather(*[client.post("/v1/chat/completions", json=body) for _ in range(3)])
                return [await first, await second], rest

        served, refused = asyncio.run(main())
        assert [r.status_code for r in served] == [200, 200]
        assert served[0].json()["choices"][0]["message"] == served[1].json()["choices"][0]["message"]
        assert [r.status_code for r in refused] == [503] * 3
        assert all(r.headers["Retry-After"].isdigit() and r.json()["error"]["code"] == "server_busy" for r in refused)
    finally:
        srv.stop()
