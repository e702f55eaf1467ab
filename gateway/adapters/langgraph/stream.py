"""The LangGraph API's run streams: Threadline's events, mapped, resumable.

A run's events come from the in-process stream API (`gateway.live.run_stream`), as for
`/v1/runs/{run_id}/events`: its resume semantics and the tenant's stream limits. Each
event is mapped by `gateway.adapters.langgraph.events`. The SSE `id:` of a part is the resume
token of the Threadline event it came from; when one event makes several parts, all
but the last carry `{token}~{index}`. A reconnect (`Last-Event-ID`) reads the run
from its start again, folding the answer so far, and writes only what follows the
part named: no gap, no repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from aiohttp import web

from gateway.adapters.langgraph.events import VALUES, Part, StateValues, Translator
from gateway.adapters.langgraph.threads import values_view
from gateway.adapters.langgraph.views import ASSISTANT_ID
from gateway.http.auth import TENANT
from gateway.http.problems import Problem
from gateway.keys import FEED, READ_MODEL
from gateway.live.run_stream import STREAMS, EventStream, Gone, KeepAlive
from gateway.live.sse import SseEvent
from gateway.live.streaming import SSE_HEADERS
from gateway.live.tokens import BadEventId
from streams.core.domain import ThreadState
from streams.core.lifecycle import StreamEnd

SETTLE_POLL_S = 0.01  # how often a wait re-reads a run whose end it has seen streamed

__all__ = ["links", "stream_run_events", "wait_for_run"]


def links(run_id: str, lg_id: str, query: str = "") -> dict[str, str]:
    """Location (the join stream) and Content-Location (the run), relative to the API root."""
    run = f"/threads/{quote(lg_id, safe='')}/runs/{quote(run_id, safe='')}"
    return {"Location": f"{run}/stream{query}", "Content-Location": run}


def _resume_point(request: web.Request, state: ThreadState, run_id: str,
                  last: str | None) -> tuple[str, int] | None:
    """The event to resume after (its token) and how many of its parts were sent; None
    for the run's start: no id, or `-1` (what the SDKs' `useStream` sends when it has
    none yet, as the LangGraph server takes it)."""
    if not last or last.strip() == "-1":
        return None
    token, _, index = last.strip().partition("~")
    try:
        event_id = request.config_dict[FEED].tokens.verify(token, state.thread_id)
    except BadEventId as exc:
        raise Problem(400, "bad-last-event-id", str(exc)) from exc
    if event_id.run_id != run_id or (index and not (index.isascii() and index.isdigit() and
                                                    len(index) <= 6)):
        raise Problem(400, "bad-last-event-id", "the event id is not from this run's stream")
    return token, int(index) + 1 if index else -1  # -1: every part of it was sent


@contextlib.asynccontextmanager
async def _run_stream(request: web.Request, run_id: str) -> AsyncIterator[EventStream]:
    """The run's events from its start (as `/v1/runs/{run_id}/events` serves them);
    Problem (404, 429) before anything is sent."""
    tenant = request[TENANT]
    run = await request.config_dict[READ_MODEL].run(tenant, run_id)
    if run is None:
        raise Problem(404, "not-found", "no such run")
    async with request.config_dict[STREAMS].open(tenant, run.state, run) as stream:
        yield stream


def _named(item: list[SseEvent] | Gone) -> list[tuple[str | None, str, Any]]:
    """(SSE id, name, data) of each event of an item; `Gone` is `message_not_streaming`."""
    if isinstance(item, Gone):
        return [(None, StreamEnd.MESSAGE_NOT_STREAMING, None)]
    return [(e.event_id, e.name, "[DONE]" if e.terminal else json.loads(e.data)) for e in item]


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
    async with _run_stream(request, run_id) as stream:  # an error is still a status
        await response.prepare(request)
        try:
            if resume is None:
                await response.write(_frame("metadata", {"run_id": run_id, "attempt": 1}, None))
            async for item in stream:
                if isinstance(item, KeepAlive):
                    await response.write(b": keep-alive\n\n")
                    continue
                for sse_id, name, data in _named(item):
                    parts = _parts(translator, name, data)
                    start = 0
                    if name == StreamEnd.MESSAGE_NOT_STREAMING:
                        skipping = False  # the run's events are gone: say how it ended
                    if skipping and resume is not None:
                        if sse_id != resume[0]:
                            parts = []
                        else:
                            skipping = False
                            start = len(parts) if resume[1] < 0 else resume[1]
                    frames = [_frame(p.event, await _fill(request, state, p),
                                     _part_id(sse_id, i, len(parts)))
                              for i, p in enumerate(parts) if i >= start]
                    if frames:
                        await response.write(b"".join(frames))
                    if translator.stopped:
                        break  # the run waits for a human: this stream ends here
                if translator.stopped:
                    break
        except ConnectionError:
            pass
    return response


def _parts(translator: Translator, name: str, data: Any) -> list[Part]:
    if name == StreamEnd.MESSAGE_NOT_STREAMING:  # the run's stream is gone: its end, from the store
        return [Part("values", VALUES), Part("end", None)]
    return translator.translate(name, data)


def _part_id(sse_id: str | None, index: int, count: int) -> str | None:
    if not sse_id:
        return None
    return sse_id if index == count - 1 else f"{sse_id}~{index}"


async def _fill(request: web.Request, state: ThreadState, part: Part) -> Any:
    if not isinstance(part.data, StateValues):
        return part.data
    state = await _caught_up(request, state)
    values = (await values_view(request, state))[0]
    interrupt = part.data.interrupt
    return values if interrupt is None else {**values, "__interrupt__": [interrupt]}


async def wait_for_run(request: web.Request, state: ThreadState, run_id: str,
                       resumed: int | None = 0) -> dict[str, Any]:
    """Read the run's events to its end, or to an interrupt past `resumed`: the thread's
    values then (and `__error__`, or `__interrupt__`)."""
    error = None
    translator = Translator(frozenset(), "", ASSISTANT_ID, resumed=resumed)
    async with _run_stream(request, run_id) as stream:
        async for item in stream:
            if isinstance(item, KeepAlive):
                continue
            ended = False
            for _, name, data in _named(item):
                translator.translate(name, data)
                if name == "run_failed" and isinstance(data, dict):
                    error = {"error": "RunFailed",
                             "message": data.get("detail") or "the run failed"}
                if name in (StreamEnd.DONE, StreamEnd.MESSAGE_NOT_STREAMING) or \
                        translator.stopped:
                    ended = True
                    break
            if ended:
                break
    state = await _caught_up(request, state)
    if translator.interrupt is None:
        await _settled(request, run_id)
        # the answer may have moved the branch's head since
        state = await request.config_dict[READ_MODEL].thread(request[TENANT],
                                                             state.thread_id) or state
    values = (await values_view(request, state))[0]
    if translator.interrupt is not None:
        values["__interrupt__"] = [translator.interrupt]
    return values if error is None else {**values, "__error__": error}


async def _settled(request: web.Request, run_id: str) -> None:
    """Wait until the read model holds the run's end: the stream's `done` can be read
    before the transaction that stored the answer is readable on the messages
    partition (its commit marker lands there later), and the values must hold it.
    Bounded like a catch-up: no progress for its timeout, and the values are what the
    model has."""
    read_model = request.config_dict[READ_MODEL]
    deadline = time.monotonic() + read_model.catch_up_timeout_s
    while time.monotonic() < deadline:
        run = await read_model.run(request[TENANT], run_id)
        if run is None or run.terminal:
            return
        await asyncio.sleep(SETTLE_POLL_S)


async def _caught_up(request: web.Request, state: ThreadState) -> ThreadState:
    """The read model has read the thread's partition to its end now: the thread then
    (its current branch may have moved since `state`, by a regenerate or an edit)."""
    config = request.config_dict
    await config[READ_MODEL].catch_up([config[FEED].partition_of(state.thread_id)])
    return await config[READ_MODEL].thread(request[TENANT], state.thread_id) or state
