"""The agent worker: runs dispatched attempts and streams their output live.

Workers share the dispatch topic as the consumer group `{prefix}worker`
(read_committed, manual commits); each dispatch record becomes an asyncio task
that runs the agent (`streams.agents`) for that attempt, at most
`concurrency` at a time (partitions are paused while all slots are busy).

For one attempt the worker, with an idempotent (not transactional, so tokens
are not held back) producer:

1. reports `ReportAttemptStarted` to the commands topic;
2. streams `StreamOutput` records to the stream topic, on the dispatch record's
   partition number: MessageStart, then per text part TextStart, TextDelta*
   (deltas coalesced for `delta_coalesce_ms`), TextEnd, then StepOutput*,
   CitationsOutput?, MessageEnd. Every execution has a fresh id, part of each
   `part_id`, and numbers its records by `seq` from 0, so a re-run of the same
   attempt starts a new message that a reader can tell apart;
3. reports `ReportHeartbeat` every `heartbeat_interval_ms` while the agent makes
   progress (it stops when the agent has been silent for half the processor's
   heartbeat timeout, so a hung agent is rescheduled);
4. reports `ReportAttemptCompleted` or `ReportAttemptFailed` and waits for the
   broker's ack.

Offsets: a partition's committed offset is the lowest dispatch still running,
so the group only moves past attempts whose outcome report was acked, or that
were superseded. A dispatch whose worker dies mid-attempt is redelivered after
the session timeout and run again, same attempt number, by whoever owns the
partition then.

Supersession: a second, group-less consumer follows the lifecycle records the
processor mirrors into the stream topic (`RunLifecycle`) on the partitions this
worker owns, and remembers each run's fate. An attempt whose run ended (completed,
failed, cancelled) or whose attempt number is past (retry_scheduled for it,
attempt_dispatched for a later one) is stopped at once, reports nothing more and
counts as finished. Before an attempt starts, the follower has read its partition
to the end at least once since assignment, and from the dispatch's time on (it
goes back for a redelivered dispatch), so a dispatch that is already dead is not
started; a dispatch older than the attempt timeout is never started.

Shutdown (SIGTERM, SIGINT): stop fetching, report running attempts failed
(retryable) so the processor retries them at once, commit, leave the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from streams.agents import (
    Agent,
    AgentCitations,
    AgentError,
    AgentOutput,
    AgentStep,
    TextChunk,
    create_agent,
)
from streams.aio import stop_client
from streams.config import Settings
from streams.domain import (
    Citation,
    Command,
    ReportAttemptCompleted,
    ReportAttemptFailed,
    ReportAttemptStarted,
    ReportHeartbeat,
    Step,
)
from streams.kafka.clients import aiokafka_config
from streams.kafka.topics import ensure_topics
from streams.records import (
    CitationsOutput,
    DeadLetter,
    Dispatch,
    MessageEnd,
    MessageStart,
    RunLifecycle,
    StepOutput,
    StreamOutput,
    StreamPart,
    TextDelta,
    TextEnd,
    TextStart,
)
from streams.serialization import Codec, DecodeError, EnvelopeMeta, new_meta
from streams.thread import OUTPUT_TOO_LARGE, answer_message_id_for

__all__ = ["DEFAULT_CONCURRENCY", "Fate", "PartitionOffsets", "Worker", "run_worker"]

log = logging.getLogger("threadline.worker")

DEFAULT_CONCURRENCY = 16
LIFECYCLE_MARGIN_MS = 5_000  # clock slack when looking for a dispatch's lifecycle records
CATCH_UP_TIMEOUT_S = 5.0
PREPARE_TIMEOUT_S = 10.0  # past this, run the dispatch without knowing its run's fate
FATES_KEPT = 100_000  # runs whose fate is remembered, most recent first
SHUTDOWN_TIMEOUT_S = 15.0
DEAD_LETTER_MAX_BYTES = 256 * 1024  # of an unreadable dispatch kept in its dead letter
OUTCOME_SEND_TRIES = 5
SHUTDOWN_ERROR = "worker shutting down"


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- pure bookkeeping ------------------------------------------------------------


@dataclass
class Fate:
    """What the lifecycle records say about a run: which of its attempts are over."""

    ended: bool = False  # completed, failed or cancelled: every attempt is over
    dead_through: int = 0  # attempts up to and including this one are over

    def learn(self, event: str, attempt: int) -> None:
        if event in ("run_completed", "run_failed", "run_cancelled"):
            self.ended = True
        elif event == "retry_scheduled":  # `attempt` is the failed one
            self.dead_through = max(self.dead_through, attempt)
        elif event == "attempt_dispatched":
            self.dead_through = max(self.dead_through, attempt - 1)

    def kills(self, attempt: int) -> bool:
        return self.ended or attempt <= self.dead_through


class PartitionOffsets:
    """One dispatch partition's offsets: running, finished, and what may be committed.

    The commit position is the lowest running offset, or one past the highest
    taken when none runs. `take` refuses offsets already taken, so records
    fetched again after a rebalance are not run twice.
    """

    def __init__(self) -> None:
        self.running: set[int] = set()
        self.done: set[int] = set()  # finished, above the commit position
        self.fetched_to: int | None = None
        self.committed: int | None = None

    def take(self, offset: int) -> bool:
        position = self.position()
        if (position is not None and offset < position) or offset in self.running \
                or offset in self.done:
            return False
        self.running.add(offset)
        self.fetched_to = max(self.fetched_to or 0, offset + 1)
        return True

    def finish(self, offset: int) -> None:
        if offset in self.running:
            self.running.discard(offset)
            self.done.add(offset)

    def position(self) -> int | None:
        if self.fetched_to is None:
            return None
        position = min(self.running) if self.running else self.fetched_to
        self.done = {o for o in self.done if o >= position}
        return position


# --- following the lifecycle records ----------------------------------------------


class _LifecycleWatch:
    """Reads `RunLifecycle` records of the owned stream partitions into run fates."""

    def __init__(self, settings: Settings, client_id: str,
                 on_fate: Callable[[str, Fate], None], codec: Codec) -> None:
        self.topic = settings.topics.stream
        self.codec = codec
        self.on_fate = on_fate
        self.fates: OrderedDict[str, Fate] = OrderedDict()
        self.covered_from: dict[int, int] = {}  # partition -> records read since (ms)
        self.caught_up: set[int] = set()  # read to the end at least once since assignment
        self._ready = asyncio.Event()  # set while `follow` is not under way
        self.consumer = AIOKafkaConsumer(
            **aiokafka_config(settings), client_id=f"{client_id}-lifecycle",
            group_id=None, enable_auto_commit=False, isolation_level="read_committed",
            auto_offset_reset="latest", request_timeout_ms=15_000,
            # Most records here are other executions' text deltas: without a minimum,
            # each of them woke a fetch (most of the worker's CPU while answers stream).
            # A run's end is learnt up to 100 ms later; nothing waits on it but a
            # superseded execution, which then stops that much later.
            fetch_min_bytes=64 * 1024, fetch_max_wait_ms=100,
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._loop(), name="lifecycle-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await stop_client(self.consumer)

    def fate(self, run_id: str) -> Fate | None:
        return self.fates.get(run_id)

    async def follow(self, partitions: set[int]) -> None:
        """Read exactly `partitions`: kept ones where they were, new ones from now."""
        self._ready.clear()
        try:
            kept: dict[int, int] = {}
            for tp in self.consumer.assignment():
                if tp.partition in partitions:
                    with contextlib.suppress(TimeoutError, KafkaError):  # then: from now
                        kept[tp.partition] = await asyncio.wait_for(self.consumer.position(tp), 5)
            self.consumer.assign([TopicPartition(self.topic, p) for p in sorted(partitions)])
            for p, offset in kept.items():
                self.consumer.seek(TopicPartition(self.topic, p), offset)
            since = _now_ms() - LIFECYCLE_MARGIN_MS
            self.covered_from = {p: self.covered_from.get(p, since) for p in kept}
            self.caught_up = {p for p in self.caught_up if p in kept}
            for p in partitions - kept.keys():
                await self._seek_to_time(p, since)
                self.covered_from[p] = since
        finally:
            self._ready.set()

    async def prepare(self, partition: int, timestamp_ms: int) -> None:
        """Before running a dispatch written at `timestamp_ms`: make sure the fates
        of its run are known, by reading the partition from that time to its end
        if it was not read that far back, or not yet to its end since assignment."""
        await self._ready.wait()
        since = timestamp_ms - LIFECYCLE_MARGIN_MS
        if partition not in self.covered_from:
            return  # no longer ours
        if since < self.covered_from[partition]:
            log.debug("lifecycle partition %d: reading again from %d", partition, since)
            self.covered_from[partition] = since
            self.caught_up.discard(partition)
            await self._seek_to_time(partition, since)
        if partition not in self.caught_up and await self._catch_up(partition):
            self.caught_up.add(partition)
        log.debug("lifecycle partition %d: caught up", partition)

    async def _catch_up(self, partition: int) -> bool:
        """Wait until the partition is read to its current end; False on timeout."""
        tp = TopicPartition(self.topic, partition)
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        try:
            end = (await self.consumer.end_offsets([tp]))[tp]
            while time.monotonic() < deadline:
                if await asyncio.wait_for(self.consumer.position(tp), CATCH_UP_TIMEOUT_S) >= end:
                    return True
                await asyncio.sleep(0.02)
        except (TimeoutError, KafkaError) as exc:
            log.warning("lifecycle catch-up on partition %d failed: %s", partition, exc)
        return False

    async def _seek_to_time(self, partition: int, timestamp_ms: int) -> None:
        tp = TopicPartition(self.topic, partition)
        log.debug("lifecycle partition %d: seeking to time %d", partition, timestamp_ms)
        try:
            found = (await self.consumer.offsets_for_times({tp: max(timestamp_ms, 0)})).get(tp)
            # Nothing that new: the end. A plain `seek` takes effect at once, where
            # `seek_to_end` waits for an offset reset by the fetcher.
            offset = (await self.consumer.end_offsets([tp]))[tp] if found is None else found.offset
            self.consumer.seek(tp, offset)
        except KafkaError as exc:  # e.g. no longer assigned after a rebalance
            log.warning("lifecycle seek on partition %d failed: %s", partition, exc)

    async def _loop(self) -> None:
        while True:
            if not self.consumer.assignment():
                await asyncio.sleep(0.05)
                continue
            try:
                batch = await self.consumer.getmany(timeout_ms=200, max_records=2_000)
                await self.codec.prepare(r.value for rs in batch.values() for r in rs)
                for records in batch.values():
                    for record in records:
                        self._read(record.value or b"")
            except Exception:  # keep following: a dead follower would stop no attempt
                log.exception("reading lifecycle records")
                await asyncio.sleep(0.5)

    def _read(self, value: bytes) -> None:
        try:
            _, output = self.codec.decode_stream(value)
        except DecodeError:
            return
        if not isinstance(output.payload, RunLifecycle):
            return
        fate = self.fates.pop(output.run_id, None) or Fate()
        fate.learn(output.payload.event, output.attempt)
        self.fates[output.run_id] = fate
        while len(self.fates) > FATES_KEPT:
            self.fates.popitem(last=False)
        self.on_fate(output.run_id, fate)


# --- one execution of one attempt --------------------------------------------------


class _Stop(Enum):
    SUPERSEDED = "superseded"  # the run or attempt is over: finished, report nothing
    REVOKED = "revoked"  # the partition moved: not finished, its new owner re-runs it
    SHUTDOWN = "shutdown"  # the worker stops: report a retryable failure if started


_END = object()


@dataclass(eq=False)
class _Execution:
    worker: Worker
    partition: int
    offset: int
    offsets: PartitionOffsets
    timestamp_ms: int
    meta: EnvelopeMeta
    dispatch: Dispatch
    execution_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    seq: int = 0
    started: bool = False
    reporting: bool = False  # the agent is done; the outcome report is on its way
    outcome_acked: bool = False
    stop_reason: _Stop | None = None
    last_progress: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None

    @property
    def attempt(self) -> int:
        return self.dispatch.attempt

    def stop(self, reason: _Stop) -> None:
        if self.stop_reason is not None or self.task is None or self.task.done():
            return
        if reason is _Stop.SHUTDOWN and self.reporting:
            return  # let the outcome report finish
        self.stop_reason = reason
        self.task.cancel()

    @property
    def finished(self) -> bool:
        """Whether the group may move past this dispatch."""
        return self.outcome_acked or self.stop_reason is _Stop.SUPERSEDED

    async def run(self) -> None:
        self.started = True
        self.last_progress = time.monotonic()
        queue: asyncio.Queue[object] = asyncio.Queue()
        pump = asyncio.create_task(self._pump(queue))
        beat = asyncio.create_task(self._heartbeat())
        try:
            await self._report(self._started())
            text, steps, citations = await self._stream(queue)
            self.reporting = True
            await self._outcome(self._completed(text, steps, citations))
        except AgentError as exc:
            self.reporting = True
            await self._emit(MessageEnd("error"), "message")
            await self._outcome(self._failed(str(exc), exc.retryable))
        except asyncio.CancelledError:
            if self.stop_reason is not _Stop.SHUTDOWN:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self.reporting = True
            await self._emit(MessageEnd("error"), "message")
            await self._outcome(self._failed(SHUTDOWN_ERROR, True))
        finally:
            for task in (pump, beat):
                task.cancel()
            await asyncio.gather(pump, beat, return_exceptions=True)

    # --- the agent's output -> stream records ---

    async def _pump(self, queue: asyncio.Queue[object]) -> None:
        try:
            agent = self.worker.agent
            async for output in agent.run(self.dispatch.history, self.dispatch.input_text):
                self.last_progress = time.monotonic()
                queue.put_nowait(output)
            queue.put_nowait(_END)
        except Exception as exc:
            queue.put_nowait(exc)

    async def _stream(
        self, queue: asyncio.Queue[object]
    ) -> tuple[str, tuple[Step, ...], tuple[Citation, ...]]:
        await self._emit(MessageStart("assistant"), "message")
        coalesce_s = self.worker.settings.delta_coalesce_ms / 1000
        text: list[str] = []
        part: list[str] | None = None  # the open text part's text
        pending: list[str] = []  # deltas not yet sent
        flush_at: float | None = None
        parts = 0
        steps: list[Step] = []
        citations: list[Citation] = []
        # The answer must fit the records that carry it whole: past the cap the run
        # ends `output_too_large` (not retried: the agent would say as much again).
        budget = self.worker.settings.policy.max_output_bytes

        def spend(*texts: str) -> None:
            nonlocal budget
            budget -= sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
            if budget < 0:
                raise AgentError(OUTPUT_TOO_LARGE, retryable=False)

        async def flush() -> None:
            nonlocal flush_at
            if pending:
                await self._emit(TextDelta("".join(pending)), f"text:{parts - 1}")
                pending.clear()
            flush_at = None

        async def close_text() -> None:
            nonlocal part
            await flush()
            if part is not None:
                await self._emit(TextEnd("".join(part)), f"text:{parts - 1}")
                part = None

        while True:
            timeout = None if flush_at is None else max(0.0, flush_at - time.monotonic())
            try:
                item = await asyncio.wait_for(queue.get(), timeout)
            except TimeoutError:
                await flush()
                continue
            if item is _END:
                break
            if isinstance(item, AgentError):
                await close_text()
                raise item
            if isinstance(item, Exception):  # a bug in the agent: worth another attempt
                await close_text()
                raise AgentError(f"{type(item).__name__}: {item}", retryable=True) from item
            output: AgentOutput = item  # type: ignore[assignment]
            if isinstance(output, TextChunk):
                if not output.text:
                    continue
                try:
                    spend(output.text)
                except AgentError:
                    await close_text()
                    raise
                if part is None:
                    part, parts = [], parts + 1
                    await self._emit(TextStart(), f"text:{parts - 1}")
                part.append(output.text)
                text.append(output.text)
                pending.append(output.text)
                now = time.monotonic()
                if flush_at is None:
                    flush_at = now + coalesce_s
                if now >= flush_at:
                    await flush()
            elif isinstance(output, AgentStep):
                await close_text()
                spend(output.step.kind, output.step.name, output.step.payload_json)
                steps.append(output.step)
                step = output.step
                await self._emit(StepOutput(step.kind, step.name, step.payload_json),
                                 f"step:{len(steps) - 1}")
            elif isinstance(output, AgentCitations):
                spend(*(x for c in output.citations for x in (c.url, c.title)))
                citations.extend(output.citations)
        await close_text()
        if citations:
            await self._emit(CitationsOutput(tuple(citations)), "citations")
        await self._emit(MessageEnd("stop"), "message")
        return "".join(text), tuple(steps), tuple(citations)

    async def _emit(self, payload: StreamPart, part: str) -> None:
        output = StreamOutput(
            run_id=self.dispatch.run_id, attempt=self.attempt,
            message_id=answer_message_id_for(self.dispatch.run_id),
            part_id=f"{self.execution_id}:{part}", seq=self.seq, payload=payload,
        )
        self.seq += 1
        meta = new_meta(self.meta.thread_id, self.meta.tenant, _now_ms(),
                        self.meta.traceparent, self.meta.tracestate)
        worker = self.worker
        delivery = await worker.producer.send(
            worker.settings.topics.stream, worker.codec.encode_stream(output, meta),
            key=self.meta.thread_id.encode(), partition=self.partition)
        delivery.add_done_callback(_log_failed_delivery)

    # --- reports ---

    async def _heartbeat(self) -> None:
        settings = self.worker.settings
        interval = max(settings.heartbeat_interval_ms / 1000, 0.05)
        stall_s = max(2 * interval, settings.policy.heartbeat_timeout_ms / 2000)
        stalled = False
        while True:
            await asyncio.sleep(interval)
            if time.monotonic() - self.last_progress > stall_s:
                if not stalled:
                    log.warning("run %s attempt %d: no agent output for %.1fs; heartbeats paused",
                                self.dispatch.run_id, self.attempt, stall_s)
                stalled = True
                continue
            stalled = False
            await self._report(ReportHeartbeat(self.meta.thread_id, self.dispatch.run_id,
                                               self.attempt, self.worker.worker_id, _now_ms()))

    async def _report(self, command: Command) -> asyncio.Future[Any]:
        meta = new_meta(self.meta.thread_id, self.meta.tenant, _now_ms(),
                        self.meta.traceparent, self.meta.tracestate)
        delivery: asyncio.Future[Any] = await self.worker.producer.send(
            self.worker.settings.topics.commands, self.worker.codec.encode_command(command, meta),
            key=self.meta.thread_id.encode())
        delivery.add_done_callback(_log_failed_delivery)
        return delivery

    async def _outcome(self, command: ReportAttemptCompleted | ReportAttemptFailed) -> None:
        """Send the outcome report until the broker acks it."""
        for attempt in range(OUTCOME_SEND_TRIES):
            try:
                await asyncio.shield(await self._report(command))
                self.outcome_acked = True
                return
            except KafkaError as exc:
                log.warning("outcome report for run %s failed (%s); retrying",
                            self.dispatch.run_id, exc)
                await asyncio.sleep(0.5 * 2**attempt)
        log.error("giving up reporting the outcome of run %s attempt %d",
                  self.dispatch.run_id, self.attempt)

    def _started(self) -> ReportAttemptStarted:
        return ReportAttemptStarted(self.meta.thread_id, self.dispatch.run_id, self.attempt,
                                    self.worker.worker_id, _now_ms())

    def _completed(self, text: str, steps: tuple[Step, ...],
                   citations: tuple[Citation, ...]) -> ReportAttemptCompleted:
        return ReportAttemptCompleted(self.meta.thread_id, self.dispatch.run_id, self.attempt,
                                      self.worker.worker_id, text, steps, citations, _now_ms())

    def _failed(self, error: str, retryable: bool) -> ReportAttemptFailed:
        return ReportAttemptFailed(self.meta.thread_id, self.dispatch.run_id, self.attempt,
                                   self.worker.worker_id, error, retryable, _now_ms())


def _log_failed_delivery(delivery: asyncio.Future[Any]) -> None:
    if not delivery.cancelled() and delivery.exception() is not None:
        log.warning("a record was not delivered: %s", delivery.exception())


# --- the worker ----------------------------------------------------------------------


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.worker._commit()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.worker._assigned({tp.partition for tp in assigned})


class Worker:
    """One worker process's consumer, producer, lifecycle follower and executions."""

    def __init__(self, settings: Settings, agent: Agent, *,
                 concurrency: int = DEFAULT_CONCURRENCY, worker_id: str | None = None,
                 codec: Codec | None = None) -> None:
        self.settings = settings
        # THREADLINE_SCHEMA_REGISTRY_URL: the Confluent format; else single-object.
        self.codec = codec or Codec.from_settings(settings)
        self.agent = agent
        self.concurrency = max(1, concurrency)
        self.worker_id = (worker_id or settings.instance_id
                          or f"{socket.gethostname()}-{os.getpid()}")
        self.partitions: dict[int, PartitionOffsets] = {}
        self.executions: dict[tuple[int, int], _Execution] = {}
        self.by_run: dict[str, set[_Execution]] = {}
        self.producer = AIOKafkaProducer(
            **aiokafka_config(settings), client_id=f"worker-{self.worker_id}",
            acks="all", enable_idempotence=True,  # the default partitioner is murmur2
        )
        self.consumer = AIOKafkaConsumer(
            **aiokafka_config(settings), client_id=f"worker-{self.worker_id}",
            group_id=f"{settings.topic_prefix}worker", enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="earliest",
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=max(100, min(1_000, settings.session_timeout_ms // 5)),
            fetch_max_wait_ms=100,
        )
        self.watch = _LifecycleWatch(settings, f"worker-{self.worker_id}", self._on_fate,
                                     self.codec)
        self._background: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Run attempts until `stop` is set, then shut down as the module says."""
        await asyncio.to_thread(ensure_topics, self.settings)
        await asyncio.to_thread(self.codec.register_schemas)  # blocking HTTP: off the loop
        await self.producer.start()
        await self.watch.start()
        self.consumer.subscribe([self.settings.topics.dispatch], listener=_Rebalance(self))
        await self.consumer.start()
        log.info("worker %s started on %s (concurrency %d)", self.worker_id,
                 self.settings.bootstrap, self.concurrency)
        try:
            while not stop.is_set():
                await self._poll()
        finally:
            await self._shutdown()

    async def _poll(self) -> None:
        free = self.concurrency - len(self.executions)
        assigned = self.consumer.assignment()
        if free <= 0:
            self.consumer.pause(*assigned)
        elif self.consumer.paused():
            self.consumer.resume(*self.consumer.paused())
        batch = await self.consumer.getmany(timeout_ms=100, max_records=max(free, 1))
        await self.codec.prepare(r.value for rs in batch.values() for r in rs)
        for tp, records in batch.items():
            for record in records:
                self._take(tp.partition, record)
        await self._commit()

    def _take(self, partition: int, record: Any) -> None:
        offsets = self.partitions.get(partition)
        if offsets is None or not offsets.take(record.offset):
            return
        try:
            meta, dispatch = self.codec.decode_dispatch(record.value or b"")
        except DecodeError as exc:
            log.warning("dead-lettering dispatch %d@%d: %s", partition, record.offset, exc)
            task = asyncio.create_task(self._dead_letter(partition, record, str(exc), offsets))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return
        if _now_ms() - dispatch.dispatched_at_ms > self.settings.policy.attempt_timeout_ms:
            # The processor has timed this attempt out already.
            offsets.finish(record.offset)
            return
        execution = _Execution(self, partition, record.offset, offsets, record.timestamp,
                               meta, dispatch)
        self.executions[(partition, record.offset)] = execution
        self.by_run.setdefault(dispatch.run_id, set()).add(execution)
        execution.task = asyncio.create_task(self._execute(execution),
                                             name=f"run-{dispatch.run_id}-{dispatch.attempt}")

    async def _dead_letter(self, partition: int, record: Any, reason: str,
                           offsets: PartitionOffsets) -> None:
        """Keep an unreadable dispatch on the dead-letter topic, then move past it (the
        offset is committed only once the dead letter is acked)."""
        topic = self.settings.topics.dispatch
        key, value = record.key, (record.value or b"")[:DEAD_LETTER_MAX_BYTES]
        letter = DeadLetter(source_topic=topic, source_partition=partition,
                            source_offset=record.offset, key=key, value=value, reason=reason,
                            error_type="DecodeError", failed_at_ms=_now_ms())
        while True:
            try:
                delivery = await self.producer.send(
                    self.settings.topics.dead_letter, self.codec.encode_dead_letter(letter),
                    key=key or f"{topic}/{partition}/{record.offset}".encode(), partition=partition)
                await delivery
                break
            except KafkaError as exc:
                log.warning("dead letter for dispatch %d@%d failed (%s); retrying", partition,
                            record.offset, exc)
                await asyncio.sleep(1)
        offsets.finish(record.offset)

    async def _execute(self, execution: _Execution) -> None:
        run_id, attempt = execution.dispatch.run_id, execution.attempt
        try:
            try:
                async with asyncio.timeout(PREPARE_TIMEOUT_S):
                    await self.watch.prepare(execution.partition, execution.timestamp_ms)
            except TimeoutError:
                log.warning("run %s attempt %d: lifecycle records not read in %.0fs; running it "
                            "anyway", run_id, attempt, PREPARE_TIMEOUT_S)
            fate = self.watch.fate(run_id)
            if fate is not None and fate.kills(attempt):
                execution.stop_reason = _Stop.SUPERSEDED
                log.info("run %s attempt %d: not started (over already)", run_id, attempt)
                return
            log.info("run %s attempt %d: execution %s started", run_id, attempt,
                     execution.execution_id)
            await execution.run()
            log.info("run %s attempt %d: execution %s reported", run_id, attempt,
                     execution.execution_id)
        except asyncio.CancelledError:
            if execution.stop_reason is None:
                raise
            if execution.started:
                log.info("run %s attempt %d: execution %s stopped (%s)", run_id, attempt,
                         execution.execution_id, execution.stop_reason.value)
            else:
                log.info("run %s attempt %d: not started (%s)", run_id, attempt,
                         execution.stop_reason.value)
        except Exception:
            log.exception("run %s attempt %d: execution %s broke", run_id, attempt,
                          execution.execution_id)
        finally:
            self.executions.pop((execution.partition, execution.offset), None)
            runs = self.by_run.get(run_id)
            if runs is not None:
                runs.discard(execution)
                if not runs:
                    del self.by_run[run_id]
            if execution.finished:
                execution.offsets.finish(execution.offset)

    def _on_fate(self, run_id: str, fate: Fate) -> None:
        for execution in list(self.by_run.get(run_id, ())):
            if fate.kills(execution.attempt):
                execution.stop(_Stop.SUPERSEDED)

    async def _commit(self) -> None:
        topic = self.settings.topics.dispatch
        assigned = {tp.partition for tp in self.consumer.assignment()}
        offsets: dict[TopicPartition, int] = {}
        for partition, tracked in self.partitions.items():
            position = tracked.position()
            if partition in assigned and position is not None and position != tracked.committed:
                offsets[TopicPartition(topic, partition)] = position
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except KafkaError as exc:  # e.g. a rebalance is under way: the next commit catches up
            log.info("commit failed: %s", exc)
            return
        for tp, position in offsets.items():
            if tp.partition in self.partitions:
                self.partitions[tp.partition].committed = position

    async def _assigned(self, partitions: set[int]) -> None:
        for partition in set(self.partitions) - partitions:
            for execution in [e for (p, _), e in self.executions.items() if p == partition]:
                execution.stop(_Stop.REVOKED)
            del self.partitions[partition]
        for partition in partitions - set(self.partitions):
            self.partitions[partition] = PartitionOffsets()
        await self.watch.follow(partitions)
        log.info("assigned dispatch partitions %s", sorted(partitions))

    async def _shutdown(self) -> None:
        log.info("worker %s stopping: %d attempts in flight", self.worker_id, len(self.executions))
        tasks = [e.task for e in self.executions.values() if e.task is not None]
        for execution in list(self.executions.values()):
            execution.stop(_Stop.SHUTDOWN)
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_TIMEOUT_S)
        await self._commit()
        closers: tuple[Callable[[], Awaitable[None]], ...] = (
            partial(stop_client, self.consumer), self.watch.stop,
            partial(stop_client, self.producer), self.agent.aclose)
        for close in closers:
            try:
                await close()
            except Exception:
                log.exception("closing %s", close)
        log.info("worker %s stopped", self.worker_id)


def run_worker(settings: Settings) -> int:
    """The `threadline worker` role: run until SIGTERM or SIGINT, then exit 0."""
    concurrency = int(os.environ.get("THREADLINE_WORKER_CONCURRENCY") or DEFAULT_CONCURRENCY)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Worker(settings, create_agent(settings), concurrency=concurrency).run(stop)

    asyncio.run(main())
    return 0
