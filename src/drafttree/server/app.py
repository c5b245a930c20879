"""The OpenAI-compatible server (FastAPI + uvicorn) around one :class:`SpeculativeModel`.

    GET  /                          the web page (streams a chat completion, colours tokens per target forward)
    GET  /health                    {"status": "ok", rows, waiting, ...}
    GET  /docs                      OpenAPI documentation (request schemas in server/schemas.py)
    GET  /v1/models                 the loaded model, OpenAI list format (and GET /v1/models/{id})
    GET  /v1/drafttree/methods      the methods this model can run and the default (extension)
    POST /v1/chat/completions       chat messages -> completion (``stream`` for Server-Sent Events)
    POST /v1/completions            raw prompt (no chat template) -> completion

Every request joins one batched decode loop (server/scheduler.py): concurrent users share target forwards.
Everything a client can get wrong is answered with an HTTP status and an OpenAI-style error object.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from importlib import resources

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from drafttree.drafters import REGISTRY
from drafttree.errors import DraftTreeError
from drafttree.server.requests import MAX_BODY_BYTES, RequestError, bad_request, parse_messages, validate
from drafttree.server.scheduler import Job, QueueFull, Scheduler
from drafttree.server.schemas import ChatRequest, CompletionRequest
from drafttree.server.streaming import request_total, sse, usage
from drafttree.server.tools import AUTO_NEEDS_PARSER, PARSERS, tool_message

RETRY_AFTER_SECONDS = 2
# a generation's sampling settings, in SpeculativeModel.sampling's order (the request's names)
SAMPLING_PARAMS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "logit_bias", "min_tokens", "json_schema", "regex", "choice", "grammar")
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DISCONNECT_CHECK_SECONDS = 1.0  # how often a non-streaming request checks that its client is still there


def _error(err: RequestError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers={"Cache-Control": "no-store", **(headers or {})})


def _body_schema(model) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


class Service:
    """What the routes share: the model, its scheduler and the response builders."""

    def __init__(self, sm, api_key: str | None, max_batch: int, max_queue: int, max_body_bytes: int,
                 tool_parser: str | None = None):
        self.sm, self.api_key, self.max_body_bytes = sm, api_key, max_body_bytes
        self.tool_parser = tool_parser  # how "auto" tool choice reads the model's calls (server/tools.py)
        self.max_batch, self.max_queue = max_batch, max_queue
        self.scheduler: Scheduler | None = None
        self.model_name = sm.target.name
        self.created = int(time.time())
        have = {"": True, "head": sm.head is not None, "draft": sm.draft is not None,
                "model": sm.head is not None or sm.draft is not None, "any": True}
        self.methods = [m for m, spec in REGISTRY.items()
                        if have[spec.needs] and (sm.head is None or spec.fits(sm.head))]

    def start(self) -> None:
        if self.scheduler is None:
            self.sm.verify_cost()  # measured (or read) once before the first request
            self.scheduler = Scheduler(self.sm, self.max_batch, self.max_queue)

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise RequestError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                               code="invalid_api_key", type_="authentication_error")

    async def read_json(self, request: Request):
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.max_body_bytes:
            raise RequestError(413, f"request body is {size} bytes; the limit is {self.max_body_bytes} bytes",
                               code="request_too_large")
        data = b""
        async for part in request.stream():
            data += part
            if len(data) > self.max_body_bytes:
                raise RequestError(413, f"request body is over the limit of {self.max_body_bytes} bytes",
                                   code="request_too_large")
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: also ints over 4,300 digits
            raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json") from None

    def encode(self, req, chat: bool) -> list[torch.Tensor]:
        """The request's prompts as token ids: the chat's messages through the template, or each completion prompt."""
        sm = self.sm
        param = "messages" if chat else "prompt"
        out = []
        for prompt in [None] if chat else req.prompt:
            where = "" if chat or len(req.prompt) == 1 else f"prompt {len(out)}: "
            try:
                if chat:
                    ids = sm.encode_prompt(parse_messages(req.model_dump()), chat=True, tools=req.tools)
                elif isinstance(prompt, list):
                    vocab = sm.target.vocab_size
                    if any(t < 0 or t >= vocab for t in prompt):
                        raise bad_request(f"{where}token ids must be in [0, {vocab})", "prompt", "invalid_value")
                    ids = torch.tensor(prompt, dtype=torch.long)
                else:
                    ids = sm.encode_prompt(prompt, chat=False)
            except DraftTreeError as e:
                raise bad_request(f"{where}{e}", param) from e
            ctx = sm.max_positions
            if ids.numel() >= ctx:
                raise bad_request(f"{where}the prompt is {ids.numel()} tokens but the model's context window is {ctx} "
                                  "tokens", param, "context_length_exceeded")
            out.append(ids)
        return out

    def chunk(self, rid: str, chat: bool, created: int, text: str | None, finish: str | None, extra: dict,
              first: bool = False, logprobs: dict | None = None, index: int = 0) -> dict:
        if chat:
            delta = {} if text is None else {"content": text}
            if first:
                delta = {"role": "assistant", **delta}
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": self.model_name, "choices": [choice], **extra}

    def completion(self, results: list[dict], chat: bool, rid: str, tools=None, n: int = 1) -> dict:
        """The answer to a request of ``len(results)`` completions (``n`` of each prompt): a choice each; each prompt
        counted once. ``tools``: the request's ToolMode (server/tools.py): a finished answer is its tool calls."""
        choices = []
        for i, res in enumerate(results):
            lps = None if res["logprobs"] is None else self.logprobs(res["logprobs"], chat)
            if chat:
                message, finish = tool_message(res, tools)
                choices.append({"index": i, "message": message, "logprobs": lps, "finish_reason": finish})
            else:
                choices.append({"index": i, "text": res["text"], "logprobs": lps,
                                "finish_reason": res["finish_reason"]})
        first = results[0]
        total = request_total(results, n)
        stats = first["drafttree"] if len(results) == 1 else [r["drafttree"] for r in results]
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "usage": usage(total), "drafttree": stats}

    def logprobs(self, entries: list, chat: bool) -> dict:
        """OpenAI's logprobs object for these (TokenLogprob, text offset) pairs: chat's ``content`` list, or the
        completions route's parallel lists. A token's text is its own decoding (a token holding part of a UTF-8
        character reads as U+FFFD); -inf is reported as -9999.0, as OpenAI does (JSON has no infinities)."""
        tok = self.sm.tokenizer

        def piece(t: int) -> str:
            return tok.decode([t], skip_special_tokens=False)

        def raw(t: int, s: str) -> list[int]:  # the token's own bytes: part of a character's, where it holds part
            return token_bytes(tok, t, s)

        def finite(lp: float) -> float:
            return max(lp, -9999.0)

        if chat:
            def item(t: int, lp: float) -> dict:
                s = piece(t)
                return {"token": s, "logprob": finite(lp), "bytes": raw(t, s)}
            content = [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                       for e, _ in entries]
            return {"content": content, "refusal": None}
        return {"tokens": [piece(e.token) for e, _ in entries],
                "token_logprobs": [finite(e.logprob) for e, _ in entries],
                "top_logprobs": [{piece(t): finite(lp) for t, lp in e.top} for e, _ in entries],
                "text_offset": [offset for _, offset in entries]}


@functools.cache
def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's, used by SmolLM2, Qwen, Llama 3 ...): the character that spells each byte
    in a token's string, printable bytes as themselves and the others shifted past U+0100 in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = dict(zip(printable, printable, strict=True)), 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return {chr(c): b for b, c in chars.items()}


def token_bytes(tok, t: int, text: str) -> list[int]:
    """A token's bytes, as OpenAI's ``bytes`` field has them: from its byte-level string where the tokenizer spells
    tokens in bytes (a token holding part of a UTF-8 character gives those bytes, not U+FFFD's), a byte-fallback
    token's ``<0xAB>``, else the UTF-8 of its ``text``."""
    try:
        spelled = tok.convert_ids_to_tokens(t)
    except Exception:  # noqa: BLE001 - a tokenizer without it: the text's bytes
        spelled = None
    if isinstance(spelled, str) and spelled:
        alphabet = _byte_alphabet()
        if all(c in alphabet for c in spelled):
            got = [alphabet[c] for c in spelled]
            if "\ufffd" in text or bytes(got).decode("utf-8", "replace") == text:
                return got
        if len(spelled) == 6 and spelled.startswith("<0x") and spelled.endswith(">"):
            try:
                return [int(spelled[3:5], 16)]
            except ValueError:
                pass
    return list(text.encode("utf-8"))


def create_app(sm, api_key: str | None = None, max_batch: int = 16, max_queue: int = 64,
               max_body_bytes: int = MAX_BODY_BYTES, tool_parser: str | None = None) -> FastAPI:
    """The ASGI app; the scheduler thread starts with the app (uvicorn's lifespan) and stops with it. ``tool_parser``
    (one of tools.PARSERS): tool_choice "auto" reads the model's calls in that format (None: "auto" is a 400)."""
    if tool_parser is not None and tool_parser not in PARSERS:
        raise DraftTreeError(f"tool-call parser {tool_parser!r} is not one of {', '.join(PARSERS)}")
    svc = Service(sm, api_key, max_batch, max_queue, max_body_bytes, tool_parser)

    @asynccontextmanager
    async def lifespan(app):
        svc.start()
        yield
        svc.scheduler.stop()

    app = FastAPI(title="drafttree", version="0.1.0", lifespan=lifespan,
                  description="Lossless speculative decoding behind an OpenAI-compatible API.")
    app.state.service = svc

    @app.exception_handler(RequestError)
    async def request_error(request, exc: RequestError):
        return _error(exc, {"Retry-After": str(RETRY_AFTER_SECONDS)} if exc.status == 503 else None)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        msg = f"no such endpoint: {request.method} {request.url.path}" if exc.status_code == 404 else str(exc.detail)
        if exc.status_code == 405:
            msg = f"{request.method} is not allowed on {request.url.path}"
        return _error(RequestError(exc.status_code, msg, code=code), dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return _error(bad_request(str(exc)))

    @app.exception_handler(Exception)
    async def internal_error(request, exc: Exception):
        return _error(RequestError(500, f"internal server error: {type(exc).__name__}: {exc}", type_="server_error",
                                   code="internal_error"))

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    @app.get("/index.html", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(resources.files("drafttree.server").joinpath("static/index.html").read_text())

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        if svc.scheduler is not None and not svc.scheduler.thread.is_alive():  # nothing would answer a request
            return JSONResponse({"status": "error", "model": svc.model_name,
                                 "error": "the decode loop has stopped; restart the server"}, status_code=503)
        return {"status": "ok", "model": svc.model_name, **(svc.scheduler.load() if svc.scheduler else {})}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        """Prometheus' text format: requests, tokens, latencies, tokens per target forward (server/metrics.py)."""
        if svc.scheduler is None:
            return PlainTextResponse("", media_type=PROMETHEUS_TYPE)
        load = svc.scheduler.load()
        return PlainTextResponse(svc.scheduler.metrics.render(svc.model_name, load["rows"], load["waiting"]),
                                 media_type=PROMETHEUS_TYPE)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        """vLLM's: a prompt (or chat messages, templated) as token ids, with the context window."""
        svc.authorize(request)
        body = await svc.read_json(request)
        if not isinstance(body, dict) or ("prompt" in body) == ("messages" in body):
            raise bad_request("send {\"prompt\": text} or {\"messages\": [...]}", "prompt")
        chat = "messages" in body
        if not chat and not isinstance(body["prompt"], str):
            raise bad_request("prompt must be a string", "prompt")
        try:
            ids = svc.sm.encode_prompt(parse_messages(body) if chat else body["prompt"], chat=chat)
        except DraftTreeError as e:
            raise bad_request(str(e), "messages" if chat else "prompt") from e
        return {"count": int(ids.numel()), "max_model_len": svc.sm.max_positions,
                "tokens": ids.tolist()}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        """vLLM's: token ids as text."""
        svc.authorize(request)
        body = await svc.read_json(request)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        vocab = svc.sm.target.vocab_size
        if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < vocab for t in tokens):
            raise bad_request(f"tokens must be a list of token ids in [0, {vocab})", "tokens")
        return {"prompt": svc.sm.tokenizer.decode(tokens)}

    @app.get("/v1/models")
    async def models(request: Request):
        svc.authorize(request)
        return {"object": "list", "data": [card(svc)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, request: Request):
        svc.authorize(request)
        if name != svc.model_name:
            raise RequestError(404, f"model {name!r} not found; this server runs {svc.model_name!r}", "model",
                               "model_not_found")
        return card(svc)

    @app.get("/v1/drafttree/methods")
    async def methods(request: Request):
        svc.authorize(request)
        t = sm.target
        return {"model": svc.model_name, "default": sm.method, "methods": svc.methods,
                "dtype": str(t.dtype).replace("torch.", ""), "device": str(t.device),
                "context_length": t.context_length, "max_batch": svc.max_batch}

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatRequest))
    async def chat(request: Request):
        return await complete(svc, request, True)

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request):
        return await complete(svc, request, False)

    return app


def card(svc: Service) -> dict:
    return {"id": svc.model_name, "object": "model", "created": svc.created, "owned_by": "drafttree"}


async def complete(svc: Service, request: Request, chat: bool):
    svc.authorize(request)
    body = await svc.read_json(request)
    req = validate(ChatRequest if chat else CompletionRequest, body, svc.methods)
    if req.model is not None and req.model != svc.model_name:  # as GET /v1/models/{id}, OpenAI and vLLM answer
        raise RequestError(404, f"the model {req.model!r} does not exist here; this server runs {svc.model_name!r} "
                           "(GET /v1/models)", "model", "model_not_found")
    tools = req.tools_mode() if chat else None
    if tools is not None and tools.auto and svc.tool_parser is None:
        raise bad_request(AUTO_NEEDS_PARSER, "tool_choice")
    params = req.generation()
    if tools is not None and tools.auto and req.skip_special_tokens is None:
        params["skip_special"] = False  # the parser reads the call tags, special tokens in some vocabularies (Qwen's)
    prompts = svc.encode(req, chat)
    # as vLLM and OpenAI: a prompt and an asked-for max_tokens that do not fit the context window together are a 400
    # (not an answer cut short); without max_tokens the default shrinks to what fits
    ctx, asked = svc.sm.max_positions, req.max_completion_tokens or req.max_tokens
    longest = max(ids.numel() for ids in prompts)
    room = ctx - longest
    if asked is not None and asked > room:
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        raise bad_request(f"the model's context window is {ctx} tokens: {longest} in the prompt and {asked} "
                          f"asked for the completion; at most {room} completion tokens fit", param,
                          "context_length_exceeded")
    params["max_new_tokens"] = min(params["max_new_tokens"], room)
    try:
        sampling = svc.sm.sampling(**{k: params[k] for k in SAMPLING_PARAMS})
    except DraftTreeError as e:
        msg, field = str(e), req.structured()[0]
        if field and (msg.startswith(("json_schema", "regex", "choice", "grammar")) or "structured" in msg):
            raise bad_request(msg, field) from e  # the request field that carried the constraint
        raise bad_request(msg, next((k for k in SAMPLING_PARAMS if k in msg), None)) from e
    try:
        ends = svc.sm.end_ids(params["stop_token_ids"], params["ignore_eos"])
    except DraftTreeError as e:
        raise bad_request(str(e), "stop_token_ids") from e
    seed, loop = params["seed"], asyncio.get_running_loop()
    n = req.n or 1  # n completions of each prompt: n rows of the batch each, choice k * n + j for prompt k
    jobs = [Job(ids, req.method or svc.sm.method, sampling, params["max_new_tokens"], params["stop"],
                None if seed is None else (seed + i) & (2**64 - 1), loop, logprobs=params["logprobs"], end_ids=ends,
                include_stop=params["include_stop"], skip_special=params["skip_special"])
            for i, ids in enumerate(ids for ids in prompts for _ in range(n))]
    if len(jobs) > svc.max_queue:  # would be refused however idle the server: not a reason to retry
        what = f"n={n} completions" if len(prompts) == 1 else f"{len(prompts)} prompts x n={n} completions"
        raise bad_request(f"{what} cannot be queued: this server queues at most {svc.max_queue} requests "
                          "(--max-queue)", "n" if len(prompts) == 1 else "prompt")
    try:
        svc.scheduler.submit(jobs)
    except QueueFull as e:
        for job in jobs:
            job.cancel()
        raise RequestError(503, f"the server is busy: {e}; retry later", code="server_busy",
                           type_="server_error") from None
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    try:
        firsts = [await job.events.get() for job in jobs]  # errors before the first forward get a proper status
    except asyncio.CancelledError:
        for job in jobs:
            job.cancel()
        raise
    for first in firsts:
        if first[0] == "error":
            for job in jobs:
                job.cancel()
            raise RequestError(first[1], first[2],
                               type_="server_error" if first[1] >= 500 else "invalid_request_error")
    if req.stream:
        with_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(sse(svc, jobs, firsts, chat, rid, with_usage, tools, n),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def last_event(job: Job, event):
        while event[0] == "chunk":
            event = await job.events.get()
        return event

    whole = asyncio.gather(*(last_event(job, first) for job, first in zip(jobs, firsts, strict=True)))
    try:
        while True:  # the disconnect check on the clock: a generating row sends an event every round
            try:
                events = await asyncio.wait_for(asyncio.shield(whole), timeout=DISCONNECT_CHECK_SECONDS)
                break
            except asyncio.TimeoutError:
                if await request.is_disconnected():  # nobody will read the answer: free the rows
                    for job in jobs:
                        job.cancel()
                    whole.cancel()
                    return JSONResponse({}, status_code=499)
    except asyncio.CancelledError:
        for job in jobs:
            job.cancel()
        whole.cancel()
        raise
    for event in events:
        if event[0] == "error":
            raise RequestError(event[1], event[2], type_="server_error")
    return JSONResponse(svc.completion([event[1] for event in events], chat, rid, tools, n))
