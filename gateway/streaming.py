"""The SSE endpoints: a thread's stream (every run) and one run's events.

Where a stream starts:

* `Last-Event-ID` (header), or the `last_event_id` / `last_entry_id` query
  parameter (the reference API's entry id is our event id): right after that event.
* `last_message_id` alone (reference API): the client holds that message, so the
  stream starts as a fresh one would; the id must be a message of the thread.
* `last_message_id` with `last_entry_id` (reference API: both from the data of the
  last event received): while that message streams, right after the entry; once it
  ended, `message_not_streaming` (the client fetches it over REST), then the stream
  goes on as a fresh one would (a run stream closes).
* otherwise, a thread stream starts at the `run_accepted` of the run in progress,
  or live if none; a run stream starts at the run's `run_accepted`.

Events older than the feed's window are replayed from Kafka first, then the window,
then the live queue; positions only go up, so the joins have no gap or duplicate.
A position that retention removed gets `message_not_streaming` and the stream goes
on as a fresh one would (thread) or closes (run). A run stream closes after `done`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from aiohttp.http_writer import StreamWriter

from gateway.auth import TENANT
from gateway.feed import Subscriber
from gateway.keys import CODEC, FEED, LIMITER, OPTIONS, READ_MODEL, SETTINGS
from gateway.problems import Problem
from gateway.read_model import RunView
from gateway.replay import ReplayGone, replay
from gateway.sse import (
    Position,
    SseEvent,
    comment_frame,
    not_streaming_frame,
    retry_frame,
)
from gateway.tokens import BadEventId
from streams.clock import now_ms
from streams.domain import ThreadState
from streams.ids import answer_message_id_for
from streams.observability.metrics import gateway_metrics

__all__ = ["Framing", "run_events", "serve_run", "thread_stream"]

log = logging.getLogger("threadline.gateway")

SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
FIND_RUN_MARGIN_MS = 60_000
REPLAY_BATCH = 200  # replayed events per write


@dataclass(frozen=True, slots=True)
class _Plan:
    after: Position  # deliver events after this position
    scan_from: int  # where a Kafka replay starts reading (the run's start)
    run_id: str | None  # the run the position is in, for message_not_streaming
    from_time_ms: int | None = None  # find the run by time (its start is unknown)
    # last_message_id named a message that ended: say message_not_streaming first.
    ended: bool = False
    token: str | None = None  # the resume token the client sent


def _not_found(what: str) -> Problem:
    return Problem(404, "not-found", f"no such {what}")


async def _resume(request: web.Request, partition: int, state: ThreadState,
                  run_id: str | None) -> _Plan | None:
    token = (request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
             or request.query.get("last_entry_id"))
    message_id = request.query.get("last_message_id")
    feed = request.app[FEED]
    event_id = None
    if token:
        try:  # the one place a client's resume token is read
            event_id = feed.tokens.verify(token.strip(), state.thread_id)
        except BadEventId as exc:
            raise Problem(400, "bad-last-event-id", str(exc)) from exc
    # The message being streamed is stored only once it ends: while it streams, its
    # id is the answer id of the token's run.
    streaming_answer = event_id is not None and message_id == answer_message_id_for(
        event_id.run_id)
    if message_id is not None and not streaming_answer and \
            not request.app[READ_MODEL].has_message(state.thread_id, message_id):
        raise Problem(400, "bad-last-event-id", "last_message_id is not a message of this thread")
    if event_id is None:
        return None
    if event_id.partition != partition or (run_id is not None and event_id.run_id != run_id):
        raise Problem(400, "bad-last-event-id", "the event id is not from this stream")
    if event_id.offset > feed.last_offsets.get(partition, -1) and \
            event_id.offset >= await feed.end_offset(partition):
        raise Problem(400, "bad-last-event-id", "the event id is ahead of the stream")
    scan_from = event_id.run_start if event_id.run_start >= 0 else event_id.offset
    ended = message_id is not None and await _run_ended(request, state, event_id.run_id)
    return _Plan(event_id.position, scan_from, event_id.run_id, ended=ended,
                 token=(token or "").strip())


async def _run_ended(request: web.Request, state: ThreadState, run_id: str) -> bool:
    """Whether the run is over (the reference contract's "the message ended")."""
    known = request.app[FEED].tracker.runs.get(run_id)
    if known is not None:
        return known.terminal
    run = await request.app[READ_MODEL].run(state.tenant, run_id)
    return run is None or run.terminal


class Framing(Protocol):
    """How a stream's events become bytes, when not as our own SSE frames (one
    instance per connection: it may keep state, e.g. `gateway.ui_stream`)."""

    @property
    def headers(self) -> Mapping[str, str]:
        """Response headers beyond the SSE ones."""

    def encode(self, events: list[SseEvent]) -> bytes:
        """The bytes of these events, each new to the client, in order."""

    def gone(self, thread_id: str, run_id: str | None) -> bytes:
        """The bytes that say the replay position left the topic."""


class _Writer:
    def __init__(self, response: web.StreamResponse, run_stream: bool,
                 max_buffered: int = 1 << 20, framing: Framing | None = None) -> None:
        self.response, self.run_stream = response, run_stream
        self.max_buffered = max_buffered
        self.framing = framing
        self.last: Position = (-1, -1)
        self.done = False

    def _frames(self, events: list[SseEvent]) -> bytes:
        new = []
        for event in events:
            if event.position <= self.last or self.done:
                continue
            new.append(event)
            self.last = event.position
            self.done = self.run_stream and event.terminal
        if new:
            gateway_metrics().sse_events.inc(len(new))
        if self.framing is not None:
            return self.framing.encode(new) if new else b""
        return b"".join([event.frame for event in new])

    def gone(self, thread_id: str, run_id: str | None, token: str | None) -> bytes:
        """The frame that says the client's message no longer streams (its `seq` the
        position the client gave)."""
        if self.framing is not None:
            return self.framing.gone(thread_id, run_id)
        return not_streaming_frame(thread_id, run_id, seq=token, at_ms=now_ms())

    async def send(self, events: list[SseEvent]) -> None:
        data = self._frames(events)
        if data:
            await self.response.write(data)

    def send_now(self, events: list[SseEvent]) -> bool:
        """The live path: write without waiting. False if the connection is gone or
        holds more than `max_buffered` unsent bytes (a client that stopped reading)."""
        data = self._frames(events)
        return not data or self.write_now(data)

    def write_now(self, data: bytes) -> bool:
        # aiohttp's StreamResponse.write is a coroutine only to wait for the buffer to
        # drain; its payload writer's own framing (chunked or not) is synchronous.
        writer = self.response._payload_writer  # pinned aiohttp; tests/gateway pin the API
        if not isinstance(writer, StreamWriter):
            return False
        transport = writer.transport
        if transport is None or transport.is_closing() or \
                transport.get_write_buffer_size() > self.max_buffered:
            return False
        if writer.chunked:
            writer._write_chunked_payload(data)
        else:
            writer._write(data)
        return True


async def thread_stream(request: web.Request) -> web.StreamResponse:
    """GET /v1/threads/{thread_id}/stream"""
    state = await request.app[READ_MODEL].thread(request[TENANT], request.match_info["thread_id"])
    if state is None:
        raise _not_found("thread")
    return await _serve(request, state, None)


async def run_events(request: web.Request) -> web.StreamResponse:
    """GET /v1/runs/{run_id}/events"""
    run = await request.app[READ_MODEL].run(request[TENANT], request.match_info["run_id"])
    if run is None:
        raise _not_found("run")
    return await _serve(request, run.state, run)


def _live_plan(here: int) -> _Plan:
    """Everything the feed ingests after offset `here` (the feed's position then)."""
    return _Plan((here + 1, -1), here + 1, None)


async def _fresh_plan(request: web.Request, state: ThreadState, run: RunView | None,
                      here: int | None = None) -> _Plan:
    """Where a stream without a resume position starts; `here` is the feed's position
    when the client subscribed (None: not subscribed yet, take it now)."""
    feed = request.app[FEED]
    if here is None:
        here = feed.last_offsets.get(feed.partition_of(state.thread_id), -1)
    if run is None:
        active = feed.active_run(state.thread_id)
        if active is None and state.active_run is not None:  # e.g. its window was evicted
            known = feed.tracker.runs.get(state.active_run.run_id)
            if known is not None and not known.terminal:
                active = (state.active_run.run_id, known.start)
        if active is None:
            return _live_plan(here)
        return _Plan((active[1], -1), active[1], active[0])
    run_id = run.run_id
    known = feed.tracker.runs.get(run_id)
    if known is None:  # maybe the feed has not read that far yet
        await feed.catch_up(feed.partition_of(state.thread_id))
        known = feed.tracker.runs.get(run_id)
    if known is not None:
        return _Plan((known.start, -1), known.start, run_id)
    if not run.terminal:
        return _live_plan(here)  # its start is still ahead of the feed
    return _Plan((-1, -1), 0, run_id, run.accepted_at_ms - FIND_RUN_MARGIN_MS)


async def serve_run(request: web.Request, run: RunView, framing: Framing) -> web.StreamResponse:
    """One run's events from its start, framed by `framing` (its frames carry no
    event ids, so a client of it resumes by reading the run from its start again)."""
    return await _serve(request, run.state, run, framing)


async def _serve(request: web.Request, state: ThreadState, run: RunView | None,
                 framing: Framing | None = None) -> web.StreamResponse:
    run_id = None if run is None else run.run_id
    app = request.app
    feed, limiter, tenant = app[FEED], app[LIMITER], request[TENANT]
    partition = feed.partition_of(state.thread_id)
    plan = await _resume(request, partition, state, run_id)
    if plan is None:
        plan = await _fresh_plan(request, state, run)
    # The tenant's limits are checked before the headers go out, so a refusal is a 429.
    with limiter.stream(tenant), contextlib.ExitStack() as replaying:
        sub, snapshot, covered = feed.subscribe(state.thread_id, run_id)
        here = feed.last_offsets.get(partition, -1)  # the feed's position at subscribing
        try:
            if _needs_replay(plan, covered):
                replaying.enter_context(limiter.replay(tenant))
            headers = SSE_HEADERS if framing is None else {**SSE_HEADERS, **framing.headers}
            response = web.StreamResponse(headers=headers)
            await response.prepare(request)
            return await _stream(request, response, state, run, plan, sub, snapshot,
                                 covered, here, replaying, framing)
        finally:
            feed.unsubscribe(sub)


def _needs_replay(plan: _Plan, covered: Position) -> bool:
    return plan.after < covered or plan.from_time_ms is not None


async def _stream(request: web.Request, response: web.StreamResponse, state: ThreadState,
                  run: RunView | None, plan: _Plan, sub: Subscriber, snapshot: list[SseEvent],
                  covered: Position, here: int, replaying: contextlib.ExitStack,
                  framing: Framing | None = None) -> web.StreamResponse:
    """Catch up (releasing the replay slot after), then live, on a prepared response."""
    feed, options = request.app[FEED], request.app[OPTIONS]
    partition = feed.partition_of(state.thread_id)
    run_id = None if run is None else run.run_id
    out = _Writer(response, run_id is not None, framing=framing)
    # Nothing at or before the resume position, whatever path it comes by: this
    # gateway's feed may be behind the one the client read before, and then the
    # live queue still brings events the client has (found by the chaos run).
    out.last = plan.after
    try:
        await response.write(retry_frame(options.retry_ms))
        if plan.ended:
            await response.write(out.gone(state.thread_id, plan.run_id, plan.token))
            if run_id is not None:
                return response
            plan = await _fresh_plan(request, state, None, here)
            out.last = plan.after
        # A position retention removed: say so, then start as a fresh stream would,
        # and if even that is gone, live. (Only a replay raises ReplayGone, so a
        # fallback runs while the replay slot is held.)
        with replaying:
            for fallback in range(3):
                try:
                    await _catch_up(request, out, plan, partition, state.thread_id, run_id,
                                    covered)
                except ReplayGone:
                    await response.write(out.gone(state.thread_id, plan.run_id, plan.token))
                    if run_id is not None:
                        return response
                    plan = await _fresh_plan(request, state, None, here) if fallback == 0 \
                        else _live_plan(here)
                    out.last = plan.after
                    continue
                await out.send([e for e in snapshot if e.position > plan.after])
                break

        def finished() -> bool:
            return run is not None and _run_over(request, run)

        await _live(request, out, sub, options.keepalive_s, finished)
    except ConnectionError:
        pass  # the client went away
    except Exception:  # the headers are sent: end the stream, the client resumes
        log.exception("stream of thread %s failed", state.thread_id)
    return response


async def _catch_up(request: web.Request, out: _Writer, plan: _Plan, partition: int,
                    thread_id: str, run_id: str | None, covered: Position) -> None:
    """Replay (plan.after, covered] from Kafka if the window does not reach back that far."""
    if plan.after >= covered and plan.from_time_ms is None:
        return
    settings = request.app[SETTINGS]
    gateway_metrics().replays.inc()
    events = replay(settings, request.app[FEED].tokens, partition, thread_id,
                    scan_from=plan.scan_from, after=plan.after, until=covered, run_id=run_id,
                    from_time_ms=plan.from_time_ms,
                    max_records=settings.limits.replay_max_records, codec=request.app[CODEC])
    sent = out.last
    # One write per REPLAY_BATCH events, not per event: a write costs as much as
    # making the event, and the records are all there to read.
    batch: list[SseEvent] = []
    count = 0
    async with contextlib.aclosing(events) as replayed:
        try:
            async for event in replayed:
                count += 1
                batch.append(event)
                if len(batch) >= REPLAY_BATCH:
                    await out.send(batch)
                    batch = []
        except Exception:
            if batch:  # what was read goes out before the error ends the stream
                await out.send(batch)
            raise
    if batch:
        await out.send(batch)
    gateway_metrics().replay_events.observe(count)
    if plan.from_time_ms is not None and out.last == sent:
        raise ReplayGone(f"run {run_id} is no longer in the stream topic")


def _run_over(request: web.Request, run: RunView) -> bool:
    """True if the run ended and everything up to its end was already sent."""
    known = request.app[FEED].tracker.runs.get(run.run_id)
    if known is not None:
        return known.terminal
    return run.terminal


async def _live(request: web.Request, out: _Writer, sub: Subscriber, keepalive_s: float,
                finished: Callable[[], bool]) -> None:
    """Caught up: the feed writes each new event straight to this connection (see
    `Subscriber.attach`); this task only keeps the connection alive and ends it."""

    def sink(events: list[SseEvent]) -> bool:
        if not out.send_now(events):
            return False
        if out.done:  # a run stream's terminal event went out
            sub.close("done")
        return True

    sub.attach(sink)
    while sub.closed is None and not out.done:
        # The run over: everything up to its end was written when it was ingested.
        if finished():
            return
        await sub.wait(keepalive_s)
        transport = request.transport
        if sub.closed is not None or transport is None or transport.is_closing():
            return
        if not out.write_now(comment_frame("keep-alive")):
            return
