"""An OpenAI-compatible HTTP server around one :class:`SpeculativeModel` (standard library only).

    GET  /                          the web page (streams a chat completion, colours tokens per target forward)
    GET  /health                    {"status": "ok", ...}
    GET  /v1/models                 the loaded model, OpenAI list format (and GET /v1/models/{id})
    GET  /v1/drafttree/methods      the methods this model can run and the default (extension)
    POST /v1/chat/completions       chat messages -> completion (``stream`` for Server-Sent Events)
    POST /v1/completions            raw prompt (no chat template) -> completion

Requests are served one generation at a time (a lock; batch size 1); the others wait. Everything a client can
get wrong is answered with HTTP 4xx and an OpenAI-style error object; the server keeps serving.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

import torch

from drafttree.drafters import REGISTRY
from drafttree.errors import DraftTreeError
from drafttree.server.requests import (
    MAX_BODY_BYTES,
    ROUTES,
    RequestError,
    bad_request,
    parse_messages,
    parse_prompt,
    sampling_params,
)


class App:
    """The model, its lock and the response builders; one per server."""

    def __init__(self, sm, max_body_bytes: int = MAX_BODY_BYTES, quiet: bool = False):
        self.sm = sm
        self.lock = threading.Lock()
        self.waiting = 0  # requests queued behind the running one
        self.count_lock = threading.Lock()
        self.max_body_bytes = max_body_bytes
        self.quiet = quiet
        self.model_name = sm.target.name
        self.created = int(time.time())
        have = {"": True, "head": sm.head is not None, "draft": sm.draft is not None,
                "model": sm.head is not None or sm.draft is not None}
        self.methods = [m for m, spec in REGISTRY.items() if have[spec.needs]]

    def info(self) -> dict:
        t = self.sm.target
        return {"model": self.model_name, "default": self.sm.method, "methods": self.methods,
                "dtype": str(t.dtype).replace("torch.", ""), "device": str(t.device),
                "context_length": t.context_length}

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card()]}

    def model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "drafttree"}

    # ---- generation ---------------------------------------------------------------------------------
    def start(self, body: dict, chat: bool):
        """Validate, encode and start a generation; the caller holds ``self.lock``."""
        params = sampling_params(body, self.methods)
        source = parse_messages(body) if chat else parse_prompt(body)
        sm = self.sm
        param = "messages" if chat else "prompt"
        try:
            if isinstance(source, list) and source and isinstance(source[0], int):
                vocab = sm.target.vocab_size
                if any(t < 0 or t >= vocab for t in source):
                    raise bad_request(f"token ids must be in [0, {vocab})", "prompt", "invalid_value")
                ids = torch.tensor(source, dtype=torch.long)
            else:
                ids = sm.encode_prompt(source, chat=chat)
        except DraftTreeError as e:
            raise bad_request(str(e), param) from e
        ctx = sm._runner.max_positions
        if ids.numel() >= ctx:
            raise bad_request(f"the prompt is {ids.numel()} tokens but the model's context window is {ctx} tokens",
                       param, "context_length_exceeded")
        kw = {k: v for k, v in params.items() if k != "stream"}
        try:
            s = sm.stream(ids.to(sm.target.device), **kw)
        except DraftTreeError as e:
            raise bad_request(str(e)) from e
        return s, params

    @staticmethod
    def stats(result) -> dict:
        d = result.to_dict()
        return {k: d[k] for k in ("method", "tau", "target_forwards", "tokens_per_second", "accept_lengths",
                                  "wall_time")}

    @staticmethod
    def usage(result) -> dict:
        return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.new_tokens,
                "total_tokens": result.prompt_tokens + result.new_tokens}

    @staticmethod
    def finish_reason(result) -> str:
        return "stop" if result.finish_reason == "stop" else "length"

    def completion(self, result, chat: bool, rid: str) -> dict:
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None,
                      "finish_reason": self.finish_reason(result)}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": self.finish_reason(result)}
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": [choice], "usage": self.usage(result),
                "drafttree": self.stats(result)}

    def chunk(self, rid: str, chat: bool, created: int, text: str | None, finish: str | None,
              extra: dict, first: bool = False) -> dict:
        if chat:
            delta = {} if text is None else {"content": text}
            if first:
                delta = {"role": "assistant", **delta}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": self.model_name, "choices": [choice], **extra}


# ------------------------------------------------------------------------------------------- handler


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "drafttree"
    disable_nagle_algorithm = True  # stream each forward's tokens as soon as they are written
    timeout = 300  # seconds a client may stall while sending a request or reading a response

    @property
    def app(self) -> App:
        return self.server.app

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        if not self.app.quiet:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")

    # ---- plumbing -----------------------------------------------------------------------------------
    def _path(self) -> str:
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        return path.rstrip("/") or "/"

    def _send(self, status: int, payload: bytes, ctype: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj, ensure_ascii=False).encode(), "application/json; charset=utf-8", headers)

    def _error(self, err: RequestError, headers: dict | None = None) -> None:
        self._json(err.status, err.body(), headers)

    def _dispatch(self, verb: str) -> None:
        try:
            path = self._path()
            if path.startswith("/v1/models/"):
                allowed = ("GET",)
            else:
                allowed = ROUTES.get(path)
            if allowed is None:
                raise RequestError(404, f"no such endpoint: {verb} {path}", code="not_found")
            if verb not in allowed and not (verb == "HEAD" and "GET" in allowed):
                self.close_connection = True  # the body (if any) was not read
                self._error(RequestError(405, f"{verb} is not allowed on {path}; use {', '.join(allowed)}",
                                         code="method_not_allowed"), {"Allow": ", ".join(allowed)})
                return
            if verb in ("GET", "HEAD"):
                self._get(path)
            else:
                self._post(path)
        except RequestError as e:
            if e.status in (404, 413, 411):
                self.close_connection = True
            self._error(e)
        except DraftTreeError as e:
            self._error(bad_request(str(e)))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - a bug must not take the server down
            traceback.print_exc(file=sys.stderr)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self._error(RequestError(500, f"internal server error: {type(e).__name__}: {e}",
                                         type_="server_error", code="internal_error"))

    def do_GET(self):  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self):  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self):  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self):  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self):  # noqa: N802
        self._dispatch("DELETE")

    def do_PATCH(self):  # noqa: N802
        self._dispatch("PATCH")

    def do_OPTIONS(self):  # noqa: N802
        self._dispatch("OPTIONS")

    # ---- GET ----------------------------------------------------------------------------------------
    def _get(self, path: str) -> None:
        app = self.app
        if path in ("/", "/index.html"):
            page = resources.files("drafttree.server").joinpath("static/index.html").read_bytes()
            self._send(200, page, "text/html; charset=utf-8")
        elif path == "/health":
            self._json(200, {"status": "ok", "model": app.model_name, "busy": app.lock.locked(),
                             "waiting": app.waiting})
        elif path == "/v1/models":
            self._json(200, app.models())
        elif path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if name != app.model_name:
                raise RequestError(404, f"model {name!r} not found; this server runs {app.model_name!r}",
                                   "model", "model_not_found")
            self._json(200, app.model_card())
        elif path == "/v1/drafttree/methods":
            self._json(200, app.info())

    # ---- POST ---------------------------------------------------------------------------------------
    def _read_json(self) -> dict:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise RequestError(411, "chunked request bodies are not supported; send Content-Length",
                               code="length_required")
        raw_len = self.headers.get("Content-Length")
        if raw_len is None:
            raise RequestError(411, "a JSON body with a Content-Length header is required", code="length_required")
        try:
            length = int(raw_len)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise bad_request(f"invalid Content-Length {raw_len!r}") from None
        if length > self.app.max_body_bytes:
            raise RequestError(413, f"request body is {length} bytes; the limit is {self.app.max_body_bytes} bytes",
                               code="request_too_large")
        data = self.rfile.read(length)
        if len(data) < length:
            self.close_connection = True
            raise bad_request("request body ended before Content-Length bytes")
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object", code="invalid_json")
        return body

    def _post(self, path: str) -> None:
        body = self._read_json()
        chat = path == "/v1/chat/completions"
        app = self.app
        sampling_params(body, app.methods)  # reject bad parameters without waiting for the model
        parse_messages(body) if chat else parse_prompt(body)
        with app.count_lock:
            app.waiting += 1
        try:
            app.lock.acquire()
        finally:
            with app.count_lock:
                app.waiting -= 1
        try:
            stream, params = app.start(body, chat)
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
            if params["stream"]:
                self._stream(stream, chat, rid)
            else:
                for _ in stream:
                    pass
                self._json(200, app.completion(stream.result, chat, rid))
        finally:
            app.lock.release()

    def _stream(self, stream, chat: bool, rid: str) -> None:
        app = self.app
        created = int(time.time())
        try:
            first = next(stream)  # errors before the first forward still get a proper HTTP status
        except StopIteration:
            first = None
        except DraftTreeError as e:
            raise bad_request(str(e)) from e
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Accel-Buffering", "no")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(obj) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj, ensure_ascii=False).encode())
            data += b"\n\n"
            self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))

        try:
            chunk, n = first, 0
            while chunk is not None:
                send(app.chunk(rid, chat, created, chunk.text, None,
                               {"drafttree": {"step": chunk.step, "accepted": len(chunk.tokens)}}, first=n == 0))
                n += 1
                chunk = next(stream, None)
            res = stream.result
            send(app.chunk(rid, chat, created, None, app.finish_reason(res),
                           {"usage": app.usage(res), "drafttree": app.stats(res)}, first=n == 0))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            stream.close()  # the client went away: stop generating, free the model for the next request
            self.close_connection = True
            return
        except Exception as e:  # noqa: BLE001 - headers are sent: report in-band, then end the stream
            stream.close()
            if not isinstance(e, DraftTreeError):
                traceback.print_exc(file=sys.stderr)
            err = RequestError(400 if isinstance(e, DraftTreeError) else 500, f"{type(e).__name__}: {e}",
                               type_="invalid_request_error" if isinstance(e, DraftTreeError) else "server_error")
            try:
                send(err.body())
            except OSError:
                self.close_connection = True
                return
        try:
            send(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True


# -------------------------------------------------------------------------------------------- server


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, handler, app: App):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.app = app
        super().__init__(address, handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = "127.0.0.1" if host == "0.0.0.0" else host
        if ":" in host:
            host = "[::1]" if host == "::" else f"[{host}]"
        return f"http://{host}:{port}/"


def create_server(sm, host: str = "127.0.0.1", port: int = 8000, max_body_bytes: int = MAX_BODY_BYTES,
                  quiet: bool = False) -> Server:
    """A ready (bound, not yet serving) HTTP server for ``sm``; call ``serve_forever()`` (in a thread if you like)."""
    return Server((host, port), Handler, App(sm, max_body_bytes=max_body_bytes, quiet=quiet))


__all__ = ["App", "RequestError", "Server", "create_server"]
