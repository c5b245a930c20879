"""The server tests' client (test_server.py, test_server_openai.py): plain HTTP against a ServerThread, and the
fixtures they share (conftest.py: ``sm``, ``server``, ``expected``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

PROMPT = "Name three colours of the rainbow."
MESSAGES = [{"role": "user", "content": PROMPT}]


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
