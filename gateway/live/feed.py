"""The fan-out: one stream-topic consumer per gateway process feeds every SSE client.

The consumer has no group: it reads every partition, read_committed. Each record
goes into a bounded per-thread window and, as events, into the bounded queue of
each subscriber of that thread. A subscriber that falls `queue_limit` events
behind is closed; its client reconnects with Last-Event-ID.

Coverage: a thread's window holds every event of that thread after
`covered_after`; older positions are replayed from Kafka (`gateway.live.replay`).
The feed starts at the end of each partition, or earlier where a run was active at
start-up (found in the read model), so that it sees every active run from its
`run_accepted` record and its filter state matches a replay from the run's start.

Records of threads nobody watches stay raw. Most records are an answer's parts
(text deltas) and most threads have no subscriber on a given gateway; decoding a
record and making its events (JSON, an HMAC per event id) cost about 40 µs, a third
of a busy gateway's CPU (issue #22). So the feed reads a record's key (its thread)
and its `threadline-payload` header (`streams.wire.PAYLOAD_HEADER`) first:

* a part (any payload but `RunLifecycle`) of a thread without subscribers is kept
  in the thread's window as it came: offset and value bytes, undecoded; so is a
  lifecycle record whose `threadline-lifecycle` header (`LIFECYCLE_HEADER`) names
  an event other than a run's start or end (the attempts, steps, executions and
  interrupts: most lifecycle records, and the filter's business only);
* a run's start or end, or a record without the headers (an older writer), is
  decoded at once: what requests ask of the feed at any time (a run's start and
  whether it ended: `run`, `active_run`; the read model's `note_ended`) comes from
  those records alone, through the `lifecycle` tracker, whose other facts (the
  attempts it saw) nobody reads;
* a record of a watched thread becomes events at once, written to its subscribers.

A subscriber's arrival turns its thread's raw records into events, in order
(`_materialize`), before it takes the window's snapshot. The superseded-execution
filter (`RunTracker`, `_filter` here) keeps per run a state that depends only on
that run's records in order, so advancing it thread by thread, later, gives the
state an eager feed had, and the same events, id for id (tests/gateway/
test_lazy_feed.py compares them). The window keeps its bound, `window_events`
entries, events and raw records together: a raw delta (~200 bytes) is smaller
than its event (a frame of ~500 with its signed id), so an unwatched window holds
less memory than it did.

A raw record leaving a window (the bound, an eviction, a deleted thread) is
learned by the filter without its events. A part is dropped undecoded where no run
of the thread is open as far as the filter has read: its run ended before, or is
unknown, and it would be filtered out either way. Inside an open run, the window
drops on to the next point where every run then open has ended (their terminal
records are in the window), still undecoded, if that point is within half a window:
more than the bound asks, which a resume that old replays from Kafka (the same
events). Otherwise (a run longer than half the window, or one evicted with its
window while it runs) the parts leaving are decoded, for the run's state, and no
events are made of them.

With a gateway group (`THREADLINE_GATEWAY_URL`), the consumer joins the group
instead and reads the partitions assigned to this gateway (`assigned`): the ones it
kept go on from where they were, the new ones start as at start-up, and the lost
ones end their streams ("moved") and are forgotten. Streams of the other partitions
are served by their owners (`gateway.cluster`).

The price is paid by a thread's first subscriber: it decodes the window's raw
records at once, on the event loop (at most `window_events`, about 40 µs each), the
work an eager feed spread over every record of every thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import IllegalStateError
from aiokafka.structs import ConsumerRecord

from gateway.kafka import (
    FetchBatching,
    Offsets,
    new_consumer,
    partition_for,
    run_forever,
    stop_client,
    stop_task,
    topic_partitions,
)
from gateway.live.sse import Position, RunState, RunTracker, SseEvent, make_events
from gateway.live.tokens import ResumeTokens
from gateway.model.read_model import ReadModel
from streams.aio import within
from streams.config import Settings
from streams.core.lifecycle import TERMINAL, Lifecycle
from streams.core.records import RunLifecycle, StreamOutput
from streams.kafka.liveness import heartbeat_interval_ms, session_timeout_ms
from streams.observability.metrics import gateway_metrics
from streams.wire import LIFECYCLE_HEADER, Codec, DecodeError, EnvelopeMeta, header_value, payload_named

__all__ = ["NotOwned", "StreamFeed", "Subscriber"]


class NotOwned(Exception):
    """The partition is not (or no longer) this gateway's: a rebalance moved it while
    a stream was being opened on it. Its owner serves it (421 to a hop)."""

log = logging.getLogger("threadline.gateway")

_LIFECYCLE = RunLifecycle.__name__.encode()  # the PAYLOAD_HEADER of lifecycle records
# The LIFECYCLE_HEADERs of the lifecycle records decoded on arrival: a run's start and end.
_START_OR_END = frozenset(event.encode() for event in (Lifecycle.RUN_ACCEPTED, *TERMINAL))
Decoded = tuple[EnvelopeMeta, StreamOutput]
# A record of a thread nobody watches, as the window keeps it: its offset, its value,
# and its decoded form if it was decoded on arrival (lifecycle records), else None.
Raw = tuple[int, bytes, Decoded | None]


class Subscriber:
    """One SSE client's live events (of a thread, or of one run).

    Queued until its stream has caught up (replay and window); then `attach`
    gives it a sink, and the feed writes what each ingested batch brought to the
    client's connection at the end of that batch, with no task wake-up or timer per
    event: at 10k clients those were most of the gateway's CPU per delivered event
    (docs/benchmarks.md). Under load batches grow, and so do the writes."""

    __slots__ = ("_waiter", "closed", "limit", "pending", "run_id", "sink", "thread_id")

    def __init__(self, thread_id: str, run_id: str | None, limit: int) -> None:
        self.thread_id, self.run_id, self.limit = thread_id, run_id, limit
        self.pending: deque[SseEvent] = deque()
        self.closed: str | None = None  # why: "overflow" | "shutdown" | "done" | ...
        self.sink: Callable[[list[SseEvent]], bool] | None = None
        self._waiter: asyncio.Future[None] | None = None  # set while a wait is on

    def push(self, event: SseEvent) -> bool:
        """Queue `event`. True if it is the first one queued for an attached sink since
        its last `flush`: the feed then flushes this subscriber at the end of the batch
        it is ingesting, so a client gets one write per batch, not one per event."""
        if self.closed is not None or (self.run_id is not None and event.run_id != self.run_id):
            return False
        if len(self.pending) >= self.limit:
            self.close("overflow")
            return False
        self.pending.append(event)
        if self.sink is None:
            self._wake()
            return False
        return len(self.pending) == 1

    def flush(self) -> None:
        """Write what is queued through the attached sink."""
        if self.sink is None or not self.pending or self.closed is not None:
            return
        batch = list(self.pending)
        self.pending.clear()
        try:
            taken = self.sink(batch)
        except Exception:  # one broken connection must not stop the feed for the rest
            log.exception("writing to a subscriber of %s failed", self.thread_id)
            taken = False
        if not taken:
            self.close("overflow")

    def attach(self, sink: Callable[[list[SseEvent]], bool]) -> None:
        """From now on, deliver through `sink` (the queued events at once): the feed
        calls it once per ingested batch. `sink` returns False when the client cannot
        take more (gone, or too far behind); the subscriber is then closed and its
        client resumes."""
        if self.closed is not None:
            return
        self.sink = sink
        self.flush()

    def close(self, reason: str) -> None:
        """End this client's stream with a reason (the first reason given wins)."""
        if self.closed is None:
            self.closed = reason
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Until there is something to take (queued events; none once attached) or
        the subscriber is closed, or `timeout_s` passed."""
        if self.pending or self.closed is not None:
            return
        # A bare future and a timer, not asyncio.wait_for: that makes a task per call.
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass(slots=True)
class _Window:
    partition: int
    covered_after: Position
    events: deque[SseEvent] = field(default_factory=deque)
    # Records after every event's, not yet made into events (the thread was unwatched).
    raw: deque[Raw] = field(default_factory=deque)
    subscribers: set[Subscriber] = field(default_factory=set)
    active_run: str | None = None
    # The index in `raw` of the first record after which no run of the thread is open
    # (`StreamFeed._quiet_point`): -1 if there is none, -2 if not known.
    quiet: int = -2


class StreamFeed:
    """Reads the streams topic once and fans its events out to every SSE subscriber."""
    def __init__(self, settings: Settings, read_model: ReadModel, offsets: Offsets, *,
                 window_events: int = 2_000,
                 max_windows: int = 20_000, queue_limit: int = 10_000,
                 backfill_margin_ms: int = 60_000, codec: Codec | None = None) -> None:
        self.settings = settings
        # THREADLINE_SCHEMA_REGISTRY_URL: the Confluent format; else single-object.
        self.codec = codec or Codec.from_settings(settings)
        self.read_model = read_model
        self.offsets = offsets
        self.window_events = window_events
        self.max_windows = max_windows
        self.queue_limit = queue_limit
        self.backfill_margin_ms = backfill_margin_ms
        self.topic = settings.topics.stream
        self.tokens = ResumeTokens.from_settings(settings)  # signs ids; replays and resumes share it
        # Run facts from lifecycle records, current: a run's start, whether it ended.
        self.lifecycle = RunTracker()
        # The superseded-execution filter, per thread as far as its records were looked at.
        self._filter = RunTracker()
        self._open: dict[str, set[str]] = {}  # thread -> its runs open in `_filter`
        self.start_offsets: dict[int, int] = {}
        self.last_offsets: dict[int, int] = {}
        self.subscribers: set[Subscriber] = set()
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self._dirty: list[Subscriber] = []  # attached subscribers with events to write
        self._lag_ms: deque[float] = deque(maxlen=20_000)  # record CreateTime -> written
        self._watched_ms: list[int] = []  # CreateTimes of this batch's records of watched threads
        self._dropped_floor: dict[int, Position] = {}
        self._consumer_: AIOKafkaConsumer | None = None  # made in start(): needs the loop
        self._batching: FetchBatching | None = None  # with the consumer
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()
        # With an advertised URL, the gateways share the partitions as one group.
        self.group = settings.group_id("gateway") if settings.gateway.advertised_url else None
        # None: every partition (no group). In a group, nothing until the first
        # assignment: a gateway restarted with a dead one's URL is asked for that one's
        # streams before it joins, and must answer 421, not serve from a feed that
        # will start past the position asked for (a browser's stream stalled so).
        self.owned: set[int] | None = set() if self.group else None
        # Told each assignment (the group generation, the partitions): the owner board.
        self.on_owned: Callable[[int, list[int]], Awaitable[None]] | None = None
        # The group consumer's assignors, by preference (the app's: `gateway.cluster.sticky`).
        self.assignors: tuple[type[AbstractPartitionAssignor], ...] = (RoundRobinPartitionAssignor,)
        self._assigned = asyncio.Event()
        self._taking: asyncio.Task[None] | None = None  # new partitions, their start found

    @property
    def _consumer(self) -> AIOKafkaConsumer:
        assert self._consumer_ is not None, "StreamFeed.start() first"
        return self._consumer_

    async def start(self, load_timeout_s: float = 120.0) -> None:
        """Seek to where the active runs began, wait for the read model, and start reading
        the stream: every partition, or with a group (`THREADLINE_GATEWAY_URL`) this
        gateway's share, from its first assignment on."""
        if self.group is not None:
            await self._start_in_group(load_timeout_s)
            return
        consumer = self._consumer_ = new_consumer(self.settings)
        await consumer.start()
        self._batching = FetchBatching(consumer, self.settings.gateway.fetch_batch_ms)
        tps = topic_partitions(self.settings, self.topic)
        consumer.assign(tps)
        await self._wait_for_read_model(load_timeout_s)
        await self._seek_starts(tps)
        self._task = asyncio.create_task(run_forever("stream feed", self._step))
        self._started.set()

    async def _wait_for_read_model(self, load_timeout_s: float) -> None:
        if not await self.read_model.wait_loaded(load_timeout_s):
            log.warning("stream feed: the threads read model did not load in time")

    async def _seek_starts(self, tps: list[TopicPartition]) -> None:
        """Seek each partition to its end now, or earlier where a run was active (found
        in the read model), so that the feed sees every active run from its start."""
        consumer = self._consumer
        ends = await self.offsets.end(tps)  # last stable offsets (read_committed)
        begins = await self.offsets.beginning(tps)
        wanted = {tp.partition for tp in tps}
        # After the ends: the model then holds every run accepted before them.
        await self.read_model.catch_up(sorted(wanted))
        earliest: dict[TopicPartition, int] = {}
        for thread_id, _run_id, accepted_ms in self.read_model.active_runs():
            partition = partition_for(thread_id, self.settings.partitions)
            if partition not in wanted:
                continue
            tp = TopicPartition(self.topic, partition)
            at = max(0, accepted_ms - self.backfill_margin_ms)
            earliest[tp] = min(earliest.get(tp, at), at)
        found = await self.offsets.for_times(earliest) if earliest else {}
        for tp in tps:
            start = ends[tp]
            hit = found.get(tp)
            if hit is not None:
                start = min(start, hit.offset)
            start = max(start, begins[tp])
            consumer.seek(tp, start)
            self.start_offsets[tp.partition] = start
            self.last_offsets[tp.partition] = start - 1
        log.info("stream feed starts at %s (ends %s)",
                 {tp.partition: self.start_offsets[tp.partition] for tp in tps},
                 {tp.partition: o for tp, o in ends.items()})

    async def _start_in_group(self, load_timeout_s: float) -> None:
        assert self.group is not None
        session_ms = await asyncio.to_thread(session_timeout_ms, self.settings)
        consumer = self._consumer_ = new_consumer(
            self.settings, group_id=self.group, session_timeout_ms=session_ms,
            heartbeat_interval_ms=heartbeat_interval_ms(session_ms),
            partition_assignment_strategy=self.assignors)
        await consumer.start()
        self._batching = FetchBatching(consumer, self.settings.gateway.fetch_batch_ms)
        await self._wait_for_read_model(load_timeout_s)
        consumer.subscribe([self.topic], listener=_Rebalance(self))
        self._task = asyncio.create_task(run_forever("stream feed", self._step))
        # The first assignment comes inside the task's first fetches.
        with contextlib.suppress(TimeoutError):
            await within(self._assigned.wait(), load_timeout_s)
        if not self._assigned.is_set():
            raise TimeoutError("the stream feed got no assignment from the gateway group")
        self._started.set()

    def owns(self, partition: int) -> bool:
        """Whether this gateway serves the partition's streams (without a group: all):
        assigned to it, and its start found. Between the two a stream would take the
        window for complete from offset 0 and miss what precedes the start."""
        return self.owned is None or (partition in self.owned and partition in self.start_offsets)

    async def assigned(self, partitions: set[int], generation: int) -> None:
        """The group gave this gateway `partitions` (eager: all of its share anew).
        Those it kept go on where they were; those it lost end their streams (their
        clients resume through the new owner) and are forgotten; new ones start as
        at start-up."""
        before = set(self.start_offsets)  # the partitions held, their start found
        lost, new = before - partitions, partitions - before
        self.owned = set(partitions)
        split = self.read_model.held is not None
        if split:  # the read model holds the same share
            if self._taking is not None:
                self._taking.cancel()
                self._taking = None
            self.read_model.hold(set(partitions))
        if lost:
            self._forget(lost)
        consumer = self._consumer
        for partition in sorted(partitions - new):
            consumer.seek(TopicPartition(self.topic, partition),
                          self.last_offsets.get(partition, -1) + 1)
        if new and split:
            # Their threads' read model loads first (a rebalance callback must not wait
            # for it: no heartbeat goes out meanwhile); until then they wait paused.
            tps = [TopicPartition(self.topic, p) for p in sorted(new)]
            consumer.pause(*tps)
            self._taking = asyncio.create_task(self._take(new), name="feed takes partitions")
        elif new:
            # Here, not in the fetch loop: aiokafka's fetcher is not woken by a resume,
            # so the new partitions cannot wait paused. It costs a few offset queries
            # and the read model's catch-up on them (milliseconds when it keeps up; no
            # heartbeat goes out meanwhile).
            try:
                await self._seek_starts([TopicPartition(self.topic, p) for p in sorted(new)])
            except Exception:  # Kafka unreachable: the fetch loop tries again
                log.warning("stream feed: the start of %s not found yet", sorted(new),
                            exc_info=True)
        self._assigned.set()
        if self.on_owned is not None:
            await self.on_owned(generation, sorted(partitions))

    async def _take(self, partitions: set[int]) -> None:
        """Find the start of new partitions once the read model has loaded them."""
        while True:
            try:
                await self.read_model.wait_held(partitions)
                still = sorted(p for p in partitions if p in (self.owned or set())
                               and p not in self.start_offsets)
                if not still:
                    return
                tps = [TopicPartition(self.topic, p) for p in still]
                await self._seek_starts(tps)
                consumer = self._consumer
                consumer.resume(*tps)
                for tp in tps:  # a seek wakes the fetcher: a resume alone does not
                    consumer.seek(tp, self.start_offsets[tp.partition])
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # Kafka unreachable: try again
                log.warning("stream feed: the start of %s not found yet", sorted(partitions),
                            exc_info=True)
                await asyncio.sleep(1.0)

    def _forget(self, partitions: set[int]) -> None:
        """Partitions this gateway no longer owns: end their streams, drop their state."""
        for thread_id, window in list(self._windows.items()):
            if window.partition in partitions:
                for sub in list(window.subscribers):
                    sub.close("moved")
                del self._windows[thread_id]
        for tracker in (self.lifecycle, self._filter):
            tracker.forget(lambda thread_id: self.partition_of(thread_id) in partitions)
        for thread_id in [t for t in self._open if self.partition_of(t) in partitions]:
            del self._open[thread_id]
        for partition in partitions:
            for table in (self.start_offsets, self.last_offsets, self._dropped_floor):
                table.pop(partition, None)

    @property
    def started(self) -> bool:
        """Whether the feed follows the stream: streams can be served."""
        return self._task is not None

    async def wait_started(self, timeout_s: float) -> bool:
        """Whether the feed started within `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            await within(self._started.wait(), timeout_s)
        return self.started

    async def stop(self) -> None:
        """Close every subscriber, then stop the reading task and its consumer."""
        self.close_all("shutdown")
        await stop_task(self._taking)
        await stop_task(self._task)
        if self._consumer_ is not None:
            await stop_client(self._consumer_)

    def close_all(self, reason: str) -> None:
        """End every subscriber's stream with the same reason."""
        for sub in list(self.subscribers):
            sub.close(reason)

    def drop_thread(self, thread_id: str) -> None:
        """The thread was deleted: end its open streams and forget its window, so
        nothing of it is sent again (new streams of it get 404 from the read model)."""
        window = self._windows.pop(thread_id, None)
        if window is None:
            return
        for sub in list(window.subscribers):
            sub.close("deleted")
        self._shed(thread_id, window, len(window.raw))
        here = (self.last_offsets.get(window.partition, -1) + 1, -1)
        self._dropped_floor[window.partition] = max(
            here, self._dropped_floor.get(window.partition, here))

    def partition_of(self, thread_id: str) -> int:
        """The streams partition that holds this thread's records."""
        return partition_for(thread_id, self.settings.partitions)

    # --- subscribers ----------------------------------------------------------------

    def subscribe(self, thread_id: str, run_id: str | None = None) -> \
            tuple[Subscriber, list[SseEvent], Position]:
        """Register a live subscriber; also return the window's events (filtered to
        `run_id`) and the position after which the window is complete.

        Synchronous, so nothing ingested falls between the snapshot and the queue."""
        window = self._window(thread_id)
        if window.raw:
            self._materialize(thread_id, window)
        sub = Subscriber(thread_id, run_id, self.queue_limit)
        window.subscribers.add(sub)
        self.subscribers.add(sub)
        snapshot = [e for e in window.events if e.position > window.covered_after
                    and (run_id is None or e.run_id == run_id)]
        return sub, snapshot, window.covered_after

    def unsubscribe(self, sub: Subscriber) -> None:
        """Forget a subscriber, and remove it from its thread's window."""
        self.subscribers.discard(sub)
        window = self._windows.get(sub.thread_id)
        if window is not None:
            window.subscribers.discard(sub)

    async def end_offset(self, partition: int) -> int:
        """The partition's last stable offset now."""
        tp = TopicPartition(self.topic, partition)
        return (await self.offsets.end([tp]))[tp]

    async def catch_up(self, partition: int, timeout_s: float = 5.0) -> bool:
        """Wait until the feed has ingested the partition up to its end now; NotOwned
        if it is not this gateway's, or stops being so meanwhile (a rebalance)."""
        if not self.owns(partition):
            raise NotOwned(partition)
        tp = TopicPartition(self.topic, partition)
        deadline = time.monotonic() + timeout_s
        end = await self.end_offset(partition)
        while True:
            if not self.owns(partition):
                raise NotOwned(partition)
            try:
                if await self._consumer.position(tp) >= end:
                    return True
            except IllegalStateError as exc:  # revoked between the check and the call
                raise NotOwned(partition) from exc
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)

    def active_run(self, thread_id: str) -> tuple[str, int] | None:
        """The thread's run in progress as the feed has seen it: (run id, start offset)."""
        window = self._windows.get(thread_id)
        if window is None or window.active_run is None:
            return None
        state = self.lifecycle.runs.get(window.active_run)
        return None if state is None else (window.active_run, state.start)

    def run(self, run_id: str) -> RunState | None:
        """What the feed has read of a run's lifecycle (`start`, `terminal`); None if
        it did not see the run's `run_accepted` (or forgot the run, long finished)."""
        return self.lifecycle.runs.get(run_id)

    def lags(self) -> dict[int, int]:
        """Per partition, how many records the feed has yet to read, as far as its
        consumer knows the partition's end (nothing before the feed started)."""
        consumer = self._consumer_
        if consumer is None or not self.started:
            return {}
        lags = {}
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            if high is not None:
                lags[tp.partition] = max(0, high - (self.last_offsets.get(tp.partition, -1) + 1))
        return lags

    def stats(self) -> dict[str, object]:
        """Subscriber and window counts, read positions and write lag for /healthz."""
        lag = sorted(self._lag_ms)
        return {"subscribers": len(self.subscribers), "windows": len(self._windows),
                "raw_records": sum(len(w.raw) for w in self._windows.values()),
                "start_offsets": dict(self.start_offsets),
                # With a gateway group, the partitions this gateway serves; else all.
                "owned": "all" if self.owned is None else sorted(self.owned),
                "positions": {p: o + 1 for p, o in self.last_offsets.items()},
                # Over the last records of watched threads ingested (at most 20,000): from
                # their producer's CreateTime until their events were written to every
                # caught-up client.
                "write_lag_ms": {"records": len(lag),
                                 "p50": round(lag[len(lag) // 2], 1) if lag else None,
                                 "p99": round(lag[int(len(lag) * 0.99)], 1) if lag else None}}

    # --- ingestion --------------------------------------------------------------------

    def _window(self, thread_id: str) -> _Window:
        window = self._windows.get(thread_id)
        if window is not None:
            self._windows.move_to_end(thread_id)
            return window
        partition = self.partition_of(thread_id)
        floor = (self.start_offsets.get(partition, 0), -1)
        window = _Window(partition, max(floor, self._dropped_floor.get(partition, floor)))
        self._windows[thread_id] = window
        if len(self._windows) > self.max_windows:
            self._evict(keep=thread_id)
        return window

    def _evict(self, keep: str) -> None:
        for thread_id, window in self._windows.items():
            if not window.subscribers and thread_id != keep:
                del self._windows[thread_id]
                self._shed(thread_id, window, len(window.raw))
                # A window made later for any thread of the partition covers only
                # what comes after this point.
                here = (self.last_offsets.get(window.partition, -1) + 1, -1)
                self._dropped_floor[window.partition] = max(
                    here, self._dropped_floor.get(window.partition, here))
                return

    async def _step(self) -> None:
        if self.owned is not None and (unstarted := self.owned - set(self.start_offsets)):
            tps = [TopicPartition(self.topic, p) for p in sorted(unstarted)]
            if self.read_model.held is None:
                await self._seek_starts(tps)
            elif self._taking is None or self._taking.done():  # its start not found: again
                self._consumer.pause(*tps)
                self._taking = asyncio.create_task(self._take(unstarted),
                                                   name="feed takes partitions")
        batch = await self._consumer.getmany(timeout_ms=1000, max_records=2000)
        if self._batching is not None:
            self._batching.took(batch)
        await self.codec.prepare(r.value for rs in batch.values() for r in rs)
        try:
            for tp, records in batch.items():
                partition = tp.partition
                if self.owned is not None:
                    # A rebalance may have come since the fetch (at the await above):
                    # a partition lost, one not yet sought to its start, or one kept
                    # and sought back to its position.
                    if not self.owns(partition):
                        continue
                    seen = self.last_offsets.get(partition, -1)
                    records = [r for r in records if r.offset > seen]
                for record in records:
                    self.ingest(partition, record)
        finally:
            self.flush()
        # Written to every caught-up client by now: how long after its producer did.
        # Records of threads nobody watches were written to no one: not counted (a
        # histogram observation would cost more than such a record's whole ingest).
        watched, self._watched_ms = self._watched_ms, []
        if watched:
            now_ms = time.time() * 1000
            write_lag = gateway_metrics().write_lag
            self._lag_ms.extend(now_ms - t for t in watched)
            for created_ms in watched:
                write_lag.observe(max(0.0, now_ms - created_ms) / 1000)

    def flush(self) -> None:
        """Write what the ingested records brought to every attached subscriber."""
        dirty, self._dirty = self._dirty, []
        for sub in dirty:
            sub.flush()

    def ingest(self, partition: int, record: ConsumerRecord[bytes, bytes]) -> None:
        """Take one streams record: kept raw if it is a part of a thread nobody watches,
        else decoded, and made into events if its thread is watched (see the module)."""
        offset = record.offset
        self.last_offsets[partition] = offset
        key = record.key
        window: _Window | None = None
        if key and key.isascii():
            thread_id = key.decode()
            window = self._windows.get(thread_id)
            if window is None or not window.subscribers:
                headers = record.headers
                named = payload_named(headers)
                if named is not None and (named != _LIFECYCLE or (
                        (event := header_value(headers, LIFECYCLE_HEADER)) is not None
                        and event not in _START_OR_END)):
                    if window is None:
                        window = self._window(thread_id)
                    if window.partition == partition:
                        self._windows.move_to_end(thread_id)
                        window.raw.append((offset, record.value or b"", None))
                        if len(window.events) + len(window.raw) > self.window_events:
                            self._trim(thread_id, window)
                        return
        try:
            decoded = self.codec.decode_stream(record.value or b"")
        except DecodeError as exc:
            log.warning("stream %d@%d is undecodable: %s", partition, offset, exc)
            return
        meta, output = decoded
        payload = output.payload
        if window is None or meta.thread_id != thread_id:
            thread_id = meta.thread_id
            window = self._window(thread_id)
        else:
            self._windows.move_to_end(thread_id)
        if type(payload) is RunLifecycle:
            state = self.lifecycle.admit(thread_id, offset, output)
            if state is not None:
                if state.terminal:
                    # Before any subscriber sees `done`: its next read of the thread
                    # must hold the end.
                    self.read_model.note_ended(thread_id, output.run_id)
                    if window.active_run == output.run_id:
                        window.active_run = None
                elif payload.event == Lifecycle.RUN_ACCEPTED:
                    window.active_run = output.run_id
        if window.subscribers or window.partition != partition:
            if window.subscribers:
                self._watched_ms.append(record.timestamp)
            if window.raw:
                self._materialize(thread_id, window)
            self._apply(thread_id, window, partition, offset, meta, output)
            if len(window.events) > self.window_events:
                self._trim(thread_id, window)
        else:
            window.raw.append((offset, record.value or b"", decoded))
            if window.quiet == -1:
                window.quiet = -2  # a run may end here
            if len(window.events) + len(window.raw) > self.window_events:
                self._trim(thread_id, window)

    def _decode(self, partition: int, offset: int, value: bytes) -> Decoded | None:
        try:
            return self.codec.decode_stream(value)
        except DecodeError as exc:
            log.warning("stream %d@%d is undecodable: %s", partition, offset, exc)
            return None

    def _admit(self, thread_id: str, offset: int, output: StreamOutput) -> RunState | None:
        """`_filter.admit`, keeping `_open` (the thread's runs open in the filter)."""
        state = self._filter.admit(thread_id, offset, output)
        if state is not None and type(output.payload) is RunLifecycle:
            self._opened_or_ended(thread_id, output, state)
        return state

    def _opened_or_ended(self, thread_id: str, output: StreamOutput, state: RunState) -> None:
        """Keep `_open` after the filter admitted a lifecycle record."""
        if state.terminal:
            runs = self._open.get(thread_id)
            if runs is not None:
                runs.discard(output.run_id)
                if not runs:
                    del self._open[thread_id]
        elif cast(RunLifecycle, output.payload).event == Lifecycle.RUN_ACCEPTED:
            self._open.setdefault(thread_id, set()).add(output.run_id)

    def _apply(self, thread_id: str, window: _Window, partition: int, offset: int,
               meta: EnvelopeMeta, output: StreamOutput) -> None:
        """Filter one record in its thread's order; keep its events and queue them."""
        state = self._filter.admit(thread_id, offset, output)
        if state is not None and type(output.payload) is RunLifecycle:
            self._opened_or_ended(thread_id, output, state)
        elif state is None:
            if self._filter.unknown and self._unknown(thread_id, output.run_id):
                # A run whose start the feed did not see: only Kafka can replay it. Its
                # subscribers may need this record (one resumed inside that run, after a
                # gateway restart whose feed started late): end their streams, so that
                # they resume with Last-Event-ID and replay it (found by the chaos run).
                window.covered_after = max(window.covered_after, (offset + 1, -1))
                for sub in list(window.subscribers):
                    if sub.run_id in (None, output.run_id):
                        sub.close("unknown run")
            return
        events = window.events
        subscribers = window.subscribers
        for event in make_events(self.tokens, partition, offset, state.start, meta, output):
            events.append(event)
            for sub in list(subscribers):
                if sub.push(event):
                    self._dirty.append(sub)

    def _unknown(self, thread_id: str, run_id: str) -> bool:
        """Whether a run the filter does not know is unknown to the feed: not a run of
        another thread whose lifecycle records the filter has not read yet (those are
        refused, as an eager filter refuses another thread's run)."""
        run = self.lifecycle.runs.get(run_id)
        return run is None or run.thread_id == thread_id

    def _materialize(self, thread_id: str, window: _Window) -> None:
        """Make the events of the window's raw records, in order, as they would have
        been made on arrival."""
        raw, window.raw = window.raw, deque()
        window.quiet = -2
        partition = window.partition
        for offset, value, decoded in raw:
            if decoded is None:
                decoded = self._decode(partition, offset, value)
                if decoded is None:
                    continue
            self._apply(thread_id, window, partition, offset, *decoded)
        if len(window.events) > self.window_events:
            self._trim(thread_id, window)

    def _trim(self, thread_id: str, window: _Window) -> None:
        """Back to `window_events` entries: the oldest events go first, then raw records."""
        excess = len(window.events) + len(window.raw) - self.window_events
        events = window.events
        while excess > 0 and events:
            dropped = events.popleft()
            window.covered_after = max(window.covered_after, dropped.position)
            excess -= 1
        if excess > 0:
            self._shed(thread_id, window, excess)

    def _shed(self, thread_id: str, window: _Window, count: int) -> None:
        """Drop at least `count` raw records from the head of `window` without making
        their events; the filter learns what later records of the thread need."""
        raw = window.raw
        limit = max(count, self.window_events // 2)  # at most half a window beyond `count`
        last = -1
        while raw and count > 0:
            offset, value, decoded = raw[0]
            if decoded is None and thread_id in self._open:
                # Inside a run of the thread that is open: drop on to where every run
                # open ends if that is near, undecoded; else learn this part.
                if window.quiet == -2:
                    window.quiet = self._quiet_point(thread_id, raw)
                quiet = window.quiet
                if 0 <= quiet < limit:
                    for _ in range(quiet + 1):
                        offset, _value, decoded = raw.popleft()
                        if decoded is not None:
                            self._admit(thread_id, offset, decoded[1])
                    window.quiet = -2
                    count -= quiet + 1
                    last = offset
                    continue
                raw.popleft()
                window.quiet = quiet - 1 if quiet > 0 else quiet
                count -= 1
                last = offset
                decoded = self._decode(window.partition, offset, value)
                if decoded is not None:
                    self._admit(thread_id, offset, decoded[1])
                continue
            raw.popleft()
            if window.quiet >= 0:
                window.quiet -= 1
                if window.quiet < 0:
                    window.quiet = -2
            count -= 1
            last = offset
            if decoded is not None:
                self._admit(thread_id, offset, decoded[1])
        if last >= 0:
            window.covered_after = max(window.covered_after, (last + 1, -1))

    def _quiet_point(self, thread_id: str, raw: deque[Raw]) -> int:
        """The index of the first raw record after which no run of the thread is open
        in the filter (its decoded records applied in order), or -1 if none is."""
        open_runs = set(self._open.get(thread_id, ()))
        known = self._filter.runs
        accepted: set[str] = set()  # in this scan: a repeated run_accepted is ignored
        for index, (_offset, _value, decoded) in enumerate(raw):
            if decoded is None:
                continue
            output = decoded[1]
            payload = output.payload
            if type(payload) is not RunLifecycle:
                continue
            if payload.event == Lifecycle.RUN_ACCEPTED:
                if output.run_id not in known and output.run_id not in accepted:
                    accepted.add(output.run_id)
                    open_runs.add(output.run_id)
            elif payload.event in TERMINAL:
                open_runs.discard(output.run_id)
                if not open_runs:
                    return index
        return -1


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """The gateway group's assignments, to the feed. aiokafka sends no heartbeat until
    these return: the feed's work here is a few offset queries."""

    def __init__(self, feed: StreamFeed) -> None:
        self.feed = feed

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Eager: everything is revoked before each assignment; the feed acts on the
        assignment, which says what it kept."""

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """Take the new share (see `StreamFeed.assigned`)."""
        coordinator = self.feed._consumer._coordinator  # noqa: SLF001  (aiokafka: no public generation)
        generation = int(getattr(coordinator, "generation", -1))
        await self.feed.assigned({tp.partition for tp in assigned}, generation)
