"""The LangGraph API's run streams: Threadline's events, mapped, resumable.

A run's stream is read from this gateway's own `/v1/runs/{run_id}/events` over
loopback HTTP, with the caller's key, so it has that endpoint's resume semantics and
the tenant's stream limits, and each event is mapped by `gateway.langgraph_events`.
The SSE `id:` of a part is the resume token of the Threadline event it came from;
when one event makes several parts, all but the last carry `{token}~{index}`. A
reconnect (`Last-Event-ID`) reads the run from its start again, folding the answer
so far, and writes only what follows the part named: no gap, no repeat.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from gateway.keys import FEED, READ_MODEL
from gateway.langgraph_events import VALUES, Part, StateValues, Translator
from gateway.langgraph_threads import values_view
from gateway.langgraph_views import ASSISTANT_ID
from gateway.problems import Problem
from gateway.tokens import BadEventId
from streams.domain import ThreadState

__all__ = ["STREAM_CLIENT", "links", "loopback_client", "stream_run_events", "wait_for_run"]

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
STREAM_CLIENT = web.AppKey("langgraph_http", aiohttp.ClientSession)


async def loopback_client(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the HTTP client run streams read this gateway's events with."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    app[STREAM_CLIENT] = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
    yield
    await app[STREAM_CLIENT].close()


def links(run_id: str, lg_id: str, query: str = "") -> dict[str, str]:
    """Location (the join stream) and Content-Location (the run), relative to the API root."""
    run = f"/threads/{quote(lg_id, safe='')}/runs/{quote(run_id, safe='')}"
    return {"Location": f"{run}/stream{query}", "Content-Location": run}


def _resume_point(request: web.Request, state: ThreadState, run_id: str,
                  last: str | None) -> tuple[str, int] | None:
    """The event to resume after (its token) and how many of its parts were sent."""
    if not last:
        return None
    token, _, index = last.strip().partition("~")
    try:
        event_id = request.app[FEED].tokens.verify(token, state.thread_id)
    except BadEventId as exc:
        raise Problem(400, "bad-last-event-id", str(exc)) from exc
    if event_id.run_id != run_id or (index and not (index.isascii() and index.isdigit() and
                                                    len(index) <= 6)):
        raise Problem(400, "bad-last-event-id", "the event id is not from this run's stream")
    return token, int(index) + 1 if index else -1  # -1: every part of it was sent


def _key(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.headers.get("x-api-key", "").strip()


def _loopback(request: web.Request, path: str) -> str:
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    if not sock:
        raise Problem(503, "unavailable", "the connection closed")
    host = sock[0] if ":" not in sock[0] else f"[{sock[0]}]"
    return f"http://{host}:{sock[1]}{path}"


async def _events(request: web.Request,
                  run_id: str) -> AsyncGenerator[tuple[str | None, str, Any], None]:
    """The run's Threadline events from its start: (SSE id, name, data); ("", "", None)
    for each keep-alive. Raises Problem for an error status, before anything is sent."""
    url = _loopback(request, f"/v1/runs/{run_id}/events")
    session = request.app[STREAM_CLIENT]
    async with session.get(url, headers={"Authorization": f"Bearer {_key(request)}"}) as up:
        if up.status != 200:
            raise Problem(up.status if up.status >= 400 else 502, "upstream",
                          f"the run's events: {(await up.text())[:300]}")
        sse_id, name, data = None, "message", []
        async for raw in up.content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith(":"):
                yield "", "", None
                continue
            if line:
                key, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if key == "id":
                    sse_id = value
                elif key == "event":
                    name = value
                elif key == "data":
                    data.append(value)
                continue
            if data:
                text = "\n".join(data)
                yield sse_id, name, text if text == "[DONE]" else json.loads(text)
            sse_id, name, data = None, "message", []


def _frame(event: str, data: Any, event_id: str | None) -> bytes:
    head = f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n"
    return (head + (f"id: {event_id}\n" if event_id else "") + "\n").encode()


async def stream_run_events(request: web.Request, state: ThreadState, run_id: str,
                            modes: frozenset[str], last: str | None, resumed: int | None = 0,
                            after_interrupt: int = 0) -> web.StreamResponse:
    """Serve the run as LangGraph SSE parts under `modes`, after `last` if given, or
    after its interrupt number `after_interrupt`; an interrupt past `resumed` ends it
    (`Translator`)."""
    lg_id = request.match_info["thread_id"]
    resume = _resume_point(request, state, run_id, last)
    query = "".join(f"{'&' if i else '?'}stream_mode={m}" for i, m in enumerate(sorted(modes)))
    response = web.StreamResponse(headers={**SSE_HEADERS, **links(run_id, lg_id, query)})
    translator = Translator(modes, lg_id, ASSISTANT_ID, resumed=resumed,
                            after_interrupt=after_interrupt)
    skipping = resume is not None
    events = _events(request, run_id)
    try:
        first = await anext(events, None)  # an error status is still a status
        await response.prepare(request)
        if resume is None:
            await response.write(_frame("metadata", {"run_id": run_id, "attempt": 1}, None))
        item = first
        while item is not None:
            sse_id, name, data = item
            if not name:
                await response.write(b": keep-alive\n\n")
            else:
                parts = _parts(translator, name, data)
                start = 0
                if name == "message_not_streaming":
                    skipping = False  # the run's events are gone: say how it ended
                if skipping and resume is not None:
                    if sse_id != resume[0]:
                        parts = []
                    else:
                        skipping = False
                        start = len(parts) if resume[1] < 0 else resume[1]
                frames = [_frame(p.event, await _fill(request, state, p), _part_id(sse_id, i,
                                                                                   len(parts)))
                          for i, p in enumerate(parts) if i >= start]
                if frames:
                    await response.write(b"".join(frames))
                if translator.stopped:
                    break  # the run waits for a human: this stream ends here
            item = await anext(events, None)
    except ConnectionError:
        pass
    finally:
        await events.aclose()
    return response


def _parts(translator: Translator, name: str, data: Any) -> list[Part]:
    if name == "message_not_streaming":  # the run's stream is gone: its end, from the store
        return [Part("values", VALUES), Part("end", None)]
    return translator.translate(name, data)


def _part_id(sse_id: str | None, index: int, count: int) -> str | None:
    if not sse_id:
        return None
    return sse_id if index == count - 1 else f"{sse_id}~{index}"


async def _fill(request: web.Request, state: ThreadState, part: Part) -> Any:
    if not isinstance(part.data, StateValues):
        return part.data
    await request.app[READ_MODEL].catch_up([request.app[FEED].partition_of(state.thread_id)])
    values = (await values_view(request, state))[0]
    interrupt = part.data.interrupt
    return values if interrupt is None else {**values, "__interrupt__": [interrupt]}


async def wait_for_run(request: web.Request, state: ThreadState, run_id: str,
                       resumed: int | None = 0) -> dict[str, Any]:
    """Read the run's events to its end, or to an interrupt past `resumed`: the thread's
    values then (and `__error__`, or `__interrupt__`)."""
    error = None
    translator = Translator(frozenset(), "", ASSISTANT_ID, resumed=resumed)
    events = _events(request, run_id)
    try:
        async for _, name, data in events:
            translator.translate(name, data)
            if name == "run_failed" and isinstance(data, dict):
                error = {"error": "RunFailed", "message": data.get("detail") or "the run failed"}
            if name in ("done", "message_not_streaming") or translator.stopped:
                break
    finally:
        await events.aclose()
    await request.app[READ_MODEL].catch_up([request.app[FEED].partition_of(state.thread_id)])
    values = (await values_view(request, state))[0]
    if translator.interrupt is not None:
        values["__interrupt__"] = [translator.interrupt]
    return values if error is None else {**values, "__error__": error}
