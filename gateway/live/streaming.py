"""The SSE endpoints: a thread's stream (every run) and one run's events, and the SSE
writer they and the AI SDK's chat stream share.

Where a stream starts (`gateway.live.run_stream` has the rules): `Last-Event-ID`
(header), or the `last_event_id` / `last_entry_id` query parameter (the reference
API's entry id is our event id), and `last_message_id` (reference API). A position
that is gone, or a message that ended, is said with `message_not_streaming`.

`serve` writes an open `EventStream` as SSE: the `retry` frame, the catch-up, then
the live events, which the feed writes straight to the connection at the end of each
batch it ingests (`write_now`). A `Framing` turns events into bytes when they are not
sent as our own frames (`gateway.adapters.ai_sdk.chat`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from aiohttp import web
from aiohttp.http_writer import StreamWriter

from gateway.http.auth import TENANT
from gateway.http.problems import Problem
from gateway.keys import OPTIONS, READ_MODEL
from gateway.live.run_stream import STREAMS, EventStream, Gone
from gateway.live.sse import SseEvent, comment_frame, not_streaming_frame, retry_frame
from gateway.model.placement import served_here
from gateway.model.read_model import RunView
from streams.clock import now_ms
from streams.core.domain import ThreadState

__all__ = ["SSE_HEADERS", "Framing", "SseFraming", "run_events", "serve", "serve_run",
           "thread_stream", "write_now"]

log = logging.getLogger("threadline.gateway")

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}


class Framing(Protocol):
    """How a stream's events become bytes (one instance per connection: it may keep
    state, e.g. `gateway.adapters.ai_sdk.ui_stream`)."""

    @property
    def headers(self) -> Mapping[str, str]:
        """Response headers beyond the SSE ones."""

    def encode(self, events: list[SseEvent]) -> bytes:
        """The bytes of these events, each new to the client, in order."""

    def gone(self, gone: Gone) -> bytes:
        """The bytes that say the stream's position is gone, or its message ended."""

    @property
    def finished(self) -> bool:
        """Whether the bytes so far ended the response (the stream then closes before
        the run ends: the AI SDK's tool approval request)."""


class SseFraming:
    """Our own SSE frames: each event's id (a resume token), name and JSON data."""

    headers: Mapping[str, str] = {}
    finished = False

    def encode(self, events: list[SseEvent]) -> bytes:
        """The events' frames, as the feed made them."""
        return b"".join([event.frame for event in events])

    def gone(self, gone: Gone) -> bytes:
        """`message_not_streaming` (its `seq` the position the client gave)."""
        return not_streaming_frame(gone.thread_id, gone.run_id, seq=gone.token, at_ms=now_ms())


def write_now(response: web.StreamResponse, data: bytes, max_buffered: int = 1 << 20) -> bool:
    """Write without waiting. False if the connection is gone or holds more than
    `max_buffered` unsent bytes (a client that stopped reading)."""
    # aiohttp's StreamResponse.write is a coroutine only to wait for the buffer to
    # drain; its payload writer's own framing (chunked or not) is synchronous. Pinned
    # aiohttp; tests/gateway/test_gateway_units.py checks these internals exist.
    writer = response._payload_writer  # noqa: SLF001
    if not isinstance(writer, StreamWriter):
        return False
    transport = writer.transport
    if transport is None or transport.is_closing() or \
            transport.get_write_buffer_size() > max_buffered:
        return False
    if writer.chunked:
        writer._write_chunked_payload(data)  # noqa: SLF001
    else:
        writer._write(data)  # noqa: SLF001
    return True


@served_here
async def thread_stream(request: web.Request) -> web.StreamResponse:
    """GET /v1/threads/{thread_id}/stream"""
    state = await request.config_dict[READ_MODEL].thread(request[TENANT],
                                                         request.match_info["thread_id"])
    if state is None:
        raise Problem(404, "not-found", "no such thread")
    return await _serve_native(request, state, None)


@served_here
async def run_events(request: web.Request) -> web.StreamResponse:
    """GET /v1/runs/{run_id}/events"""
    run = await request.config_dict[READ_MODEL].run(request[TENANT], request.match_info["run_id"])
    if run is None:
        raise Problem(404, "not-found", "no such run")
    return await _serve_native(request, run.state, run)


async def _serve_native(request: web.Request, state: ThreadState,
                        run: RunView | None) -> web.StreamResponse:
    token = (request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
             or request.query.get("last_entry_id"))
    async with request.config_dict[STREAMS].open(
            request[TENANT], state, run, after=token,
            last_message_id=request.query.get("last_message_id")) as stream:
        return await serve(request, stream, SseFraming())


async def serve_run(request: web.Request, run: RunView, framing: Framing) -> web.StreamResponse:
    """One run's events from its start, framed by `framing` (frames without event ids:
    a client of it resumes by reading the run from its start again)."""
    async with request.config_dict[STREAMS].open(request[TENANT], run.state, run) as stream:
        return await serve(request, stream, framing)


async def serve(request: web.Request, stream: EventStream, framing: Framing) -> web.StreamResponse:
    """Write `stream` as SSE until it is over or the client goes."""
    response = web.StreamResponse(headers={**SSE_HEADERS, **framing.headers})
    await response.prepare(request)
    try:
        await response.write(retry_frame(request.config_dict[OPTIONS].retry_ms))
        async for item in stream.catch_up():
            data = framing.gone(item) if isinstance(item, Gone) else framing.encode(item)
            if data:
                await response.write(data)
            if framing.finished:
                return response
        await _live(request, response, stream, framing)
    except ConnectionError:
        pass  # the client went away
    except Exception:  # the headers are sent: end the stream, the client resumes
        log.exception("stream of thread %s failed", stream.thread_id)
    return response


async def _live(request: web.Request, response: web.StreamResponse, stream: EventStream,
                framing: Framing) -> None:
    """Caught up: the feed writes each new event straight to this connection (see
    `Subscriber.attach`); this task only keeps the connection alive and ends it."""

    def sink(events: list[SseEvent]) -> bool:
        data = framing.encode(events)
        written = not data or write_now(response, data)
        if framing.finished:
            stream.finish()
        return written

    stream.attach(sink)
    while await stream.idle():
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        if not write_now(response, comment_frame("keep-alive")):
            return
