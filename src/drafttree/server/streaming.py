"""Server-Sent Events for a completion request: every choice's chunks as the batch's rounds produce them."""

from __future__ import annotations

import asyncio
import json
import time

from drafttree.server.requests import RequestError
from drafttree.server.scheduler import Job
from drafttree.server.tools import CallStream, tool_message


def usage(res: dict) -> dict:
    """OpenAI's usage object; with the prefix cache on, ``prompt_tokens_details.cached_tokens`` too."""
    out = {"prompt_tokens": res["prompt_tokens"], "completion_tokens": res["completion_tokens"],
           "total_tokens": res["prompt_tokens"] + res["completion_tokens"]}
    if res.get("cached_tokens") is not None:
        out["prompt_tokens_details"] = {"cached_tokens": res["cached_tokens"]}
    return out


def request_total(results: list[dict], n: int = 1) -> dict:
    """A request's counts, its choices' results in choice order (``n`` per prompt): the completion tokens of every
    choice, the prompt tokens (and cached ones) of each prompt once."""
    firsts = results[::n]
    total = {**results[0], "completion_tokens": sum(r["completion_tokens"] for r in results),
             "prompt_tokens": sum(r["prompt_tokens"] for r in firsts)}
    if results[0].get("cached_tokens") is not None:
        total["cached_tokens"] = sum(r.get("cached_tokens") or 0 for r in firsts)
    return total


async def merged(jobs: list[Job], firsts: list):
    """``(choice index, event)`` from every job as its events come, until each job's last."""
    out: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, job: Job, event) -> None:
        while True:
            await out.put((i, event))
            if event[0] != "chunk":
                return
            event = await job.events.get()

    pumps = [asyncio.create_task(pump(i, job, first)) for i, (job, first) in enumerate(zip(jobs, firsts, strict=True))]
    try:
        live = len(jobs)
        while live:
            i, event = await out.get()
            live -= event[0] != "chunk"
            yield i, event
    finally:
        for p in pumps:
            p.cancel()


async def sse(svc, jobs: list[Job], firsts: list, chat: bool, rid: str, with_usage: bool = False, tools=None,
              n: int = 1):
    """Server-Sent Events: one chunk per target forward and choice (``n`` choices interleave, each chunk naming its
    index, as OpenAI streams them), then each choice's finish chunk (drafttree's stats) and [DONE]. With
    ``with_usage`` (``stream_options.include_usage``) every chunk has ``usage: null`` and one more chunk, with no
    choices, carries the usage (the prompt counted once) before [DONE], as OpenAI streams it. ``tools`` (a ToolMode):
    the text is held back and a choice's tool calls come whole in one delta before its finish chunk; "auto": the text
    goes out up to the model's first call (tools.CallStream), then the calls, or the rest of the text."""
    created, started, results = int(time.time()), set(), {}
    calls: dict[int, CallStream] = {}
    none = {"usage": None} if with_usage else {}

    def data(obj) -> bytes:
        return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj, ensure_ascii=False).encode()) + b"\n\n"

    events = merged(jobs, firsts)
    try:
        async for i, event in events:
            if event[0] == "chunk":
                _, text, accepted, step, entries = event
                stats = {**none, "drafttree": {"step": step, "accepted": accepted}}
                lps = None if entries is None else svc.logprobs(entries, chat)
                if tools is not None:
                    text = calls.setdefault(i, CallStream()).feed(text) if tools.auto else None
                yield data(svc.chunk(rid, chat, created, text, None, stats, first=i not in started, logprobs=lps,
                                     index=i))
                started.add(i)
            elif event[0] == "done":
                res = event[1]
                results[i] = res
                finish = res["finish_reason"]
                if tools is not None:
                    message, finish = tool_message(res, tools)
                    if message.get("tool_calls"):
                        delta = {"tool_calls": [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]}
                    elif tools.auto:  # the text held back since the tag
                        delta = {"content": calls.setdefault(i, CallStream()).rest(res["text"])}
                    else:
                        delta = {"content": message["content"]}
                    chunk = svc.chunk(rid, chat, created, None, None, none, first=i not in started, index=i)
                    chunk["choices"][0]["delta"].update(delta)
                    yield data(chunk)
                    started.add(i)
                yield data(svc.chunk(rid, chat, created, None, finish,
                                     {**none, "drafttree": res["drafttree"]}, first=i not in started, index=i))
                started.add(i)
            else:  # headers are sent: report in-band, then end the stream
                yield data(RequestError(event[1], event[2], type_="server_error").body())
                break
        else:
            if with_usage:
                total = request_total([results[i] for i in sorted(results)], n)
                last = svc.chunk(rid, chat, created, None, None, {"usage": usage(total)})
                yield data({**last, "choices": []})
        yield data(b"[DONE]")
    finally:
        await events.aclose()
        for job in jobs:
            job.cancel()  # a client that went away frees its row at the next round (a no-op once finished)
