"""A thread's or a run's events from a position: replayed, then live.

The one in-process stream API every protocol serves from: the native SSE endpoints
(`gateway.live.streaming`), the AI SDK's chat stream and the LangGraph runs API. None of
them reads another's HTTP output.

    async with request.config_dict[STREAMS].open(tenant, state, run, after=token) as stream:
        async for item in stream:  # lists of new SseEvents, Gone, or KEEP_ALIVE
            ...

`open` decides where the stream starts and takes the tenant's stream slot (and a
replay slot if Kafka must be read), all before a byte is sent, so a refusal is still
a status (400, 429). The stream then yields, in order and each event once:

* `Gone`: the position left the topic, or the message the client named ended. A
  thread stream goes on as a fresh one would; a run stream ends.
* the events older than the feed's window, replayed from Kafka (a batch at a time);
* the window's events; then the live events as the feed ingests them;
* `KEEP_ALIVE` when nothing came for `keepalive_s`.

A run stream ends after its `done` event. Positions only go up, so the joins have
no gap or duplicate.

Where a stream starts (`after`, `last_message_id`):

* `after`, a resume token (an event id): right after that event.
* `last_message_id` alone (reference API): the client holds that message, so the
  stream starts as a fresh one would; the id must be a message of the thread.
* `last_message_id` with `after`: while that message streams, right after the
  event; once it ended, `Gone`, then as a fresh stream would (a run stream closes).
* otherwise, a thread stream starts at the `run_accepted` of the run in progress,
  or live if none; a run stream starts at the run's `run_accepted`.

Delivery is pulled (`async for`, or `catch_up()` then `live()`) by adapters that
await between events (LangGraph fills `values` parts from the read model). The
native SSE pushes instead once caught up (`attach`, `idle`): the feed writes each
ingested batch straight to the connection, with no task wake-up per event.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from aiohttp import web

from gateway.http.limits import TenantLimiter
from gateway.http.problems import Problem
from gateway.live.feed import NotOwned, StreamFeed, Subscriber
from gateway.live.replay import ReplayGone, replay
from gateway.live.sse import Position, SseEvent
from gateway.live.tokens import BadEventId
from gateway.model.read_model import ReadModel, RunView
from streams.config import Settings
from streams.core.domain import ThreadState
from streams.core.ids import answer_message_id_for
from streams.observability.metrics import gateway_metrics
from streams.wire import Codec

if TYPE_CHECKING:
    from gateway.cluster.remote import Forwarder

__all__ = ["KEEP_ALIVE", "STREAMS", "EventStream", "FeedStream", "Gone", "Item", "KeepAlive",
           "RunStreams"]

FIND_RUN_MARGIN_MS = 60_000
REPLAY_BATCH = 200  # replayed events per batch


@dataclass(frozen=True, slots=True)
class Gone:
    """The stream's position is gone from the topic, or the message named ended: its
    message is stored (`GET /v1/threads/{thread_id}/messages`). `token` is the
    position the client gave."""

    thread_id: str
    run_id: str | None
    token: str | None


class KeepAlive:
    """Nothing happened for a while: a client may be told the connection lives."""

    __slots__ = ()


KEEP_ALIVE: Final = KeepAlive()
Item = list[SseEvent] | Gone | KeepAlive


@dataclass(frozen=True, slots=True)
class _Plan:
    after: Position  # deliver events after this position
    scan_from: int  # where a Kafka replay starts reading (the run's start)
    run_id: str | None  # the run the position is in, for Gone
    from_time_ms: int | None = None  # find the run by time (its start is unknown)
    # last_message_id named a message that ended: say Gone first.
    ended: bool = False
    token: str | None = None  # the resume token the client sent


# Where a stream began, when no event was delivered yet: (offset, sub) to deliver
# after, the offset a replay reads from, and the run. A forwarded stream re-opened on
# another owner starts there, not anew: a fresh start there could come later than the
# first one did (a run begun between the two would be missed).
Start = tuple[int, int, int, str | None]


def _live_plan(here: int) -> _Plan:
    """Everything the feed ingests after offset `here` (the feed's position then)."""
    return _Plan((here + 1, -1), here + 1, None)


class EventStream(Protocol):
    """An open stream, as every protocol serves it: on this gateway's feed
    (`FeedStream`), or on the owner of its thread (`gateway.cluster.remote`)."""

    thread_id: str
    run_id: str | None

    def __aiter__(self) -> AsyncGenerator[Item, None]:
        """Every item: `catch_up`, then `live`."""
        ...

    def catch_up(self) -> AsyncGenerator[list[SseEvent] | Gone, None]:
        """What precedes the live events."""
        ...

    def live(self) -> AsyncGenerator[list[SseEvent] | KeepAlive, None]:
        """Pulled live delivery, after `catch_up`."""
        ...

    def attach(self, sink: Callable[[list[SseEvent]], bool]) -> None:
        """Pushed live delivery, after `catch_up`."""

    def finish(self) -> None:
        """End the stream here, before the run's end."""

    async def idle(self) -> bool:
        """While attached: wait up to the keep-alive; False once the stream is over."""
        ...


class RunStreams:
    """Opens event streams on the gateway's feed, within the tenants' limits; with a
    gateway group, a thread another gateway owns on that owner (`remote`)."""

    def __init__(self, settings: Settings, feed: StreamFeed, read_model: ReadModel,
                 limiter: TenantLimiter, codec: Codec, keepalive_s: float) -> None:
        self.settings, self.feed, self.read_model = settings, feed, read_model
        self.limiter, self.codec, self.keepalive_s = limiter, codec, keepalive_s
        self.remote: Forwarder | None = None

    @contextlib.asynccontextmanager
    async def open(self, tenant: str, state: ThreadState, run: RunView | None = None, *,
                   after: str | None = None,
                   last_message_id: str | None = None) -> AsyncIterator[EventStream]:
        """The thread's events (or `run`'s, a run of that thread), from the position
        `after` and `last_message_id` give (see the module); Problem (400, 429) if it
        cannot be served (503 if its owner cannot be reached). Held slots are released
        when the block ends."""
        partition = self.feed.partition_of(state.thread_id)
        if self.remote is None or self.feed.owns(partition):
            async with contextlib.AsyncExitStack() as opened:
                try:
                    stream = await opened.enter_async_context(self.open_local(
                        tenant, state, run, after=after, last_message_id=last_message_id))
                except NotOwned:
                    stream = None  # a rebalance moved the partition meanwhile: forward
                if stream is not None:
                    yield stream
                    return
        assert self.remote is not None  # without a group every partition is owned
        local = _Local(self, tenant, state, run, partition)
        with self.limiter.stream(tenant):
            async with self.remote.open(tenant, state.thread_id, partition,
                                        None if run is None else run.run_id, after,
                                        last_message_id, local) as remote:
                yield remote

    @contextlib.asynccontextmanager
    async def open_local(self, tenant: str, state: ThreadState, run: RunView | None = None, *,
                         after: str | None = None, last_message_id: str | None = None,
                         slot: bool = True, start: Start | None = None) -> AsyncIterator[FeedStream]:
        """`open`, on this gateway's feed; NotOwned if a rebalance took the partition
        away while the start was being found (a subscriber of a partition the feed no
        longer reads would wait forever). `slot=False`: the tenant's stream slot is
        held already, by the gateway the client reached (a hop, or a forwarded stream
        come back to this feed): one client stream takes one slot."""
        feed, limiter = self.feed, self.limiter
        run_id = None if run is None else run.run_id
        partition = feed.partition_of(state.thread_id)
        plan = _Plan((start[0], start[1]), start[2], start[3]) if start is not None and \
            after is None else await self._resume(partition, state, run_id, after, last_message_id)
        if plan is None:
            plan = await _fresh_plan(feed, state, run)
        if not feed.owns(partition):  # checked with no await between it and subscribing
            raise NotOwned(partition)
        held = limiter.stream(tenant) if slot else contextlib.nullcontext()
        with held, contextlib.ExitStack() as replaying:
            sub, snapshot, covered = feed.subscribe(state.thread_id, run_id)
            here = feed.last_offsets.get(partition, -1)  # the feed's position at subscribing
            try:
                if plan.after < covered or plan.from_time_ms is not None:
                    replaying.enter_context(limiter.replay(tenant))
                stream = FeedStream(self, state, run, plan, sub, snapshot, covered, here,
                                    replaying)
                try:
                    yield stream
                finally:
                    await stream.aclose()
            finally:
                feed.unsubscribe(sub)

    async def _resume(self, partition: int, state: ThreadState, run_id: str | None,
                      token: str | None, message_id: str | None) -> _Plan | None:
        feed = self.feed
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
                not self.read_model.has_message(state.thread_id, message_id):
            raise Problem(400, "bad-last-event-id",
                          "last_message_id is not a message of this thread")
        if event_id is None:
            return None
        if event_id.partition != partition or (run_id is not None and event_id.run_id != run_id):
            raise Problem(400, "bad-last-event-id", "the event id is not from this stream")
        if event_id.offset > feed.last_offsets.get(partition, -1) and \
                event_id.offset >= await feed.end_offset(partition):
            raise Problem(400, "bad-last-event-id", "the event id is ahead of the stream")
        if feed.run(event_id.run_id) is None:
            # Maybe the feed has not read that far yet (the read model, a consumer of
            # its own, may have): else a stream would take the run for over, by the
            # read model, before the feed brought any of its events.
            await feed.catch_up(partition)
        scan_from = event_id.run_start if event_id.run_start >= 0 else event_id.offset
        ended = message_id is not None and await _run_ended(feed, self.read_model, state,
                                                             event_id.run_id)
        return _Plan(event_id.position, scan_from, event_id.run_id, ended=ended,
                     token=(token or "").strip())


@dataclass(frozen=True, slots=True)
class _Local:
    """A forwarded stream's way back to this gateway's feed, should its partition
    come here (`gateway.cluster.remote.LocalStreams`)."""

    streams: RunStreams
    tenant: str
    state: ThreadState
    run: RunView | None
    partition: int

    def owns(self) -> bool:
        return self.streams.feed.owns(self.partition)

    @contextlib.asynccontextmanager
    async def open(self, after: str | None,
                   start: Start | None = None) -> AsyncIterator[FeedStream]:
        # From the last event received: where the client is, whatever it named first.
        # The run read anew: the view the request began with may say it runs when it
        # has ended since, and a stream of an ended run this feed started after would
        # wait for live events forever (seen with an owner killed mid-run).
        run = self.run
        if run is not None:
            run = await self.streams.read_model.run(self.tenant, run.run_id) or run
        # The slot is the forwarded stream's, held since it opened.
        async with self.streams.open_local(self.tenant, self.state, run, after=after,
                                           slot=False, start=start) as stream:
            yield stream


async def _run_ended(feed: StreamFeed, read_model: ReadModel, state: ThreadState,
                     run_id: str) -> bool:
    """Whether the run is over (the reference contract's "the message ended")."""
    known = feed.run(run_id)
    if known is not None:
        return known.terminal
    run = await read_model.run(state.tenant, run_id)
    return run is None or run.terminal


async def _fresh_plan(feed: StreamFeed, state: ThreadState, run: RunView | None,
                      here: int | None = None) -> _Plan:
    """Where a stream without a resume position starts; `here` is the feed's position
    when the client subscribed (None: not subscribed yet, take it now)."""
    if here is None:
        here = feed.last_offsets.get(feed.partition_of(state.thread_id), -1)
    if run is None:
        active = feed.active_run(state.thread_id)
        if active is None and state.active_run is not None:  # e.g. its window was evicted
            known = feed.run(state.active_run.run_id)
            if known is not None and not known.terminal:
                active = (state.active_run.run_id, known.start)
        if active is None:
            return _live_plan(here)
        return _Plan((active[1], -1), active[1], active[0])
    run_id = run.run_id
    known = feed.run(run_id)
    if known is None:  # maybe the feed has not read that far yet
        await feed.catch_up(feed.partition_of(state.thread_id))
        known = feed.run(run_id)
    if known is not None:
        return _Plan((known.start, -1), known.start, run_id)
    if not run.terminal:
        return _live_plan(here)  # its start is still ahead of the feed
    return _Plan((-1, -1), 0, run_id, run.accepted_at_ms - FIND_RUN_MARGIN_MS)


class FeedStream:
    """One open stream of a thread's (or a run's) events on this gateway's feed; see
    the module."""

    def __init__(self, streams: RunStreams, state: ThreadState, run: RunView | None,
                 plan: _Plan, sub: Subscriber, snapshot: list[SseEvent], covered: Position,
                 here: int, replaying: contextlib.ExitStack) -> None:
        self._streams, self._state, self._run, self._plan = streams, state, run, plan
        self._sub, self._snapshot, self._covered, self._here = sub, snapshot, covered, here
        self._replaying = replaying
        self.thread_id = state.thread_id
        self.run_id = None if run is None else run.run_id
        self.keepalive_s = streams.keepalive_s
        # Nothing at or before the resume position, whatever path it comes by: this
        # gateway's feed may be behind the one the client read before, and then the
        # live queue still brings events the client has (found by the chaos run).
        self.last: Position = plan.after
        # Where the stream began (None: found by time, so not known yet).
        self.start: Start | None = None if plan.from_time_ms is not None else \
            (plan.after[0], plan.after[1], plan.scan_from, plan.run_id)
        self.done = False  # a run stream's `done` was delivered
        self.ended = False  # a run stream whose position is gone: nothing more comes
        self._iterators: list[AsyncGenerator[Item, None]] = []  # closed with the stream

    def _owned(self, iterator: AsyncGenerator[Item, None]) -> AsyncGenerator[Item, None]:
        self._iterators.append(iterator)
        return iterator

    async def aclose(self) -> None:
        """Close the iterators handed out (a Kafka replay among them), done or not."""
        for iterator in reversed(self._iterators):
            await iterator.aclose()

    def __aiter__(self) -> AsyncGenerator[Item, None]:
        return self._owned(self._items())

    async def _items(self) -> AsyncGenerator[Item, None]:
        async for item in self.catch_up():
            yield item
        async for batch in self.live():
            yield batch

    def take(self, events: list[SseEvent]) -> list[SseEvent]:
        """Of `events`, those new to the client, in order (each position once, nothing
        after a run stream's `done`); they count as delivered."""
        new = []
        for event in events:
            if event.position <= self.last or self.done:
                continue
            new.append(event)
            self.last = event.position
            self.done = self.run_id is not None and event.terminal
        if new:
            gateway_metrics().sse_events.inc(len(new))
        return new

    def catch_up(self) -> AsyncGenerator[list[SseEvent] | Gone, None]:
        """What precedes the live events: `Gone`, the replay from Kafka, the window.
        Releases the replay slot when done."""
        iterator = self._catch_up()
        self._owned(iterator)
        return iterator

    async def _catch_up(self) -> AsyncGenerator[list[SseEvent] | Gone, None]:
        streams, plan = self._streams, self._plan
        if plan.ended:
            yield Gone(self.thread_id, plan.run_id, plan.token)
            if self.run_id is not None:
                self.ended = True
                return
            plan = await _fresh_plan(streams.feed, self._state, None, self._here)
            self.last = plan.after
        # A position retention removed: say so, then start as a fresh stream would,
        # and if even that is gone, live. (Only a replay raises ReplayGone, so a
        # fallback runs while the replay slot is held.)
        with self._replaying:
            for fallback in range(3):
                try:
                    async with contextlib.aclosing(self._replay(plan)) as replayed:
                        async for batch in replayed:
                            yield batch
                except ReplayGone:
                    yield Gone(self.thread_id, plan.run_id, plan.token)
                    if self.run_id is not None:
                        self.ended = True
                        return
                    plan = await _fresh_plan(streams.feed, self._state, None, self._here) \
                        if fallback == 0 else _live_plan(self._here)
                    self.last = plan.after
                    continue
                after = plan.after
                new = self.take([e for e in self._snapshot if e.position > after])
                if new:
                    yield new
                break

    async def _replay(self, plan: _Plan) -> AsyncGenerator[list[SseEvent], None]:
        """(plan.after, covered] from Kafka if the window does not reach back that far."""
        if plan.after >= self._covered and plan.from_time_ms is None:
            return
        streams = self._streams
        settings = streams.settings
        gateway_metrics().replays.inc()
        events = replay(settings, streams.feed.tokens, streams.feed.partition_of(self.thread_id),
                        self.thread_id, scan_from=plan.scan_from, after=plan.after,
                        until=self._covered, run_id=self.run_id, from_time_ms=plan.from_time_ms,
                        max_records=settings.gateway.limits.replay_max_records, codec=streams.codec)
        sent = self.last
        # One batch per REPLAY_BATCH events, not per event: a write costs as much as
        # making the event, and the records are all there to read.
        batch: list[SseEvent] = []
        count = 0
        async with contextlib.aclosing(events) as replayed:
            try:
                async for event in replayed:
                    count += 1
                    batch.append(event)
                    if len(batch) >= REPLAY_BATCH:
                        new, batch = self.take(batch), []
                        if new:
                            yield new
            except Exception:
                new = self.take(batch)
                if new:  # what was read goes out before the error ends the stream
                    yield new
                raise
        new = self.take(batch)
        if new:
            yield new
        gateway_metrics().replay_events.observe(count)
        if plan.from_time_ms is not None and self.last == sent:
            raise ReplayGone(f"run {self.run_id} is no longer in the stream topic")

    @property
    def over(self) -> bool:
        """Whether nothing more will come: closed, a run stream's end delivered, or the
        run ended and the feed had ingested all of it."""
        if self._sub.closed is not None or self.done or self.ended:
            return True
        if self._run is None:
            return False
        known = self._streams.feed.run(self._run.run_id)
        return known.terminal if known is not None else self._run.terminal

    def live(self) -> AsyncGenerator[list[SseEvent] | KeepAlive, None]:
        """Pulled live delivery, after `catch_up`: each batch the feed ingested for this
        stream, or `KEEP_ALIVE` after `keepalive_s` without one, until `over`."""
        iterator = self._live()
        self._owned(iterator)
        return iterator

    async def _live(self) -> AsyncGenerator[list[SseEvent] | KeepAlive, None]:
        sub = self._sub
        while not self.ended and sub.closed is None:
            if sub.pending:
                batch = list(sub.pending)
                sub.pending.clear()
                new = self.take(batch)
                if new:
                    yield new
                continue
            if self.over:
                return
            await sub.wait(self.keepalive_s)
            if not sub.pending and sub.closed is None:
                yield KEEP_ALIVE

    def attach(self, sink: Callable[[list[SseEvent]], bool]) -> None:
        """Pushed live delivery, after `catch_up`: the feed calls `sink` with the new
        events of each batch it ingests, at the end of that batch. `sink` returns False
        when the client cannot take more; the stream is then closed."""
        sub = self._sub

        def deliver(events: list[SseEvent]) -> bool:
            new = self.take(events)
            if new and not sink(new):
                return False
            if self.done:  # a run stream's terminal event went out
                sub.close("done")
            return True

        sub.attach(deliver)

    def finish(self) -> None:
        """End the stream here, before the run's end: its client has what it needs."""
        self._sub.close("done")

    def end_reason(self) -> str:
        """Why the stream ended: "done" (its run's end went out, or `finish`), or why
        the feed closed it ("moved": its partition went to another gateway,
        "shutdown", "overflow", "deleted", "unknown run")."""
        if self.done or self.ended:
            return "done"
        return self._sub.closed or "done"

    async def idle(self) -> bool:
        """While attached: wait up to `keepalive_s`; False once the stream is `over`."""
        if self.over:
            return False
        await self._sub.wait(self.keepalive_s)
        return self._sub.closed is None and not self.done


STREAMS = web.AppKey("streams", RunStreams)
