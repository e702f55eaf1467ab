"""One execution of one attempt: runs the agent, streams its answer, reports.

With the worker's idempotent (not transactional, so tokens are not held back)
producer, an execution reports `ReportAttemptStarted`, streams the answer's
records (`streams.worker.answer`) on the dispatch record's partition number,
reports `ReportHeartbeat` while the agent makes progress, and ends with
`ReportAttemptCompleted` or `ReportAttemptFailed`, sent until the broker acks it.

Steps: the agent runs in a `RunContext` holding the run's journal so far (the worker
sets `journal` before `run`). Each step it completes is reported as
`ReportStepCompleted`; the step is durable once the broker acks the report, because
the processor decides the thread's commands in log order. The agent goes on while
the report travels and waits for the ack at the fence: before its next tool call
starts and before the outcome is reported (`streams.agents.runtime`). An execution
that takes the attempt over waits at its barrier (`ReportExecutionStarted`, decided
after every earlier report of the thread) before the agent starts, so it sees
every step an earlier execution had acked, decided or not; a call whose report was
never acked is the one window (docs/agents.md). What the processor decides of a step
comes back through the lifecycle watch: recorded by another execution of the same
attempt, this one is deposed and stops like a superseded one; refused because the
attempt is over, the watch stops it anyway. A dead processor therefore does not
stall a run between two steps, only at its barrier and its end. Heartbeats go on
while a tool runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from streams.agents import Agent, AgentCitations, AgentError, AgentOutput, AgentStep, TextChunk
from streams.agents.runtime import InterruptRequested, RunContext, drive
from streams.aio import within
from streams.clock import now_ms
from streams.config import Settings
from streams.core.domain import (
    Citation,
    Command,
    ReportAttemptCompleted,
    ReportAttemptFailed,
    ReportAttemptStarted,
    ReportExecutionStarted,
    ReportHeartbeat,
    ReportStepCompleted,
    Step,
)
from streams.core.ids import answer_message_id_for
from streams.core.journal import INTERRUPT, JournalEntry, merge
from streams.core.records import Dispatch, StreamOutput, TextDelta
from streams.core.thread import OUTPUT_TOO_LARGE
from streams.wire import Codec, EnvelopeMeta, new_meta, payload_header
from streams.worker.answer import Answer
from streams.worker.offsets import PartitionOffsets

__all__ = ["SHUTDOWN_ERROR", "Deposed", "Execution", "Outlet", "Stop"]

log = logging.getLogger("threadline.worker")

OUTCOME_SEND_TRIES = 5
SHUTDOWN_ERROR = "worker shutting down"


class Deposed(Exception):
    """Another execution of the same attempt recorded this step first: stop quietly."""


class Stop(Enum):
    """Why an execution was stopped before it reported its outcome."""

    SUPERSEDED = "superseded"  # the run or attempt is over: finished, report nothing
    REVOKED = "revoked"  # the partition moved: not finished, its new owner re-runs it
    SHUTDOWN = "shutdown"  # the worker stops: report a retryable failure if started
    # A double text interrupted the run: report the answer so far as completed (the
    # processor stores it marked, once); finished like SUPERSEDED.
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, slots=True)
class Outlet:
    """What an execution needs of its worker: where its records go, and who it is."""

    producer: AIOKafkaProducer
    codec: Codec
    settings: Settings
    agent: Agent
    worker_id: str

    async def stream(self, output: StreamOutput, meta: EnvelopeMeta,
                     partition: int) -> asyncio.Future[Any]:
        """Send a stream record to `partition` of the stream topic; the future is its
        delivery (not waited for)."""
        delivery: asyncio.Future[Any] = await self.producer.send(
            self.settings.topics.stream, self.codec.encode_stream(output, meta),
            key=meta.thread_id.encode(), partition=partition,
            headers=[payload_header(output.payload)])
        delivery.add_done_callback(_log_failed_delivery)
        return delivery

    async def command(self, command: Command, meta: EnvelopeMeta,
                      partition: int) -> asyncio.Future[Any]:
        """Send a report to `partition` of the commands topic (the thread's: the
        dispatch record's partition number, as for the stream; every topic has the same
        count, `ensure_topics` checks it), not through aiokafka's pure-Python murmur2
        for every report; the future is its delivery."""
        delivery: asyncio.Future[Any] = await self.producer.send(
            self.settings.topics.commands, self.codec.encode_command(command, meta),
            key=meta.thread_id.encode(), partition=partition,
            headers=[payload_header(command)])  # the processor's linger reads it
        delivery.add_done_callback(_log_failed_delivery)
        return delivery


_END = object()
_DELIVERED = object()  # the last text delta's delivery completed
# A text delta due waits this long at most for the previous one's delivery.
DELTA_HOLD_MAX_S = 0.1


@dataclass(eq=False)
class Execution:
    """One execution of one dispatched attempt, from its dispatch record to its outcome."""

    outlet: Outlet
    partition: int
    offset: int
    offsets: PartitionOffsets
    timestamp_ms: int
    meta: EnvelopeMeta
    dispatch: Dispatch
    # Delivered here first (`Worker.fresh_from`): no earlier execution of the attempt
    # exists, the dispatch's journal is complete, and the barrier is passed at once.
    fresh: bool = False
    execution_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    started: bool = False
    reporting: bool = False  # the agent is done; the outcome report is on its way
    outcome_acked: bool = False
    stop_reason: Stop | None = None
    last_progress: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    journal: tuple[JournalEntry, ...] = ()  # the run's steps completed before this execution
    context: RunContext | None = None
    answer: Answer = field(init=False)
    _reported: set[int] = field(default_factory=set)  # steps this execution reported
    _seen: dict[int, JournalEntry] = field(default_factory=dict)  # recorded since the start
    _synced: asyncio.Future[list[JournalEntry]] | None = None  # the barrier's journal
    # Step reports sent and not yet acked, in order, with their deliveries.
    _unacked: deque[tuple[ReportStepCompleted, asyncio.Future[Any]]] = \
        field(default_factory=deque)
    _fence_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _delta_sent: asyncio.Future[Any] | None = None  # the last text delta's delivery
    _woken: bool = False  # its delivery will put `_DELIVERED` on the queue

    def __post_init__(self) -> None:
        settings = self.outlet.settings
        self.answer = Answer(self.dispatch.run_id, self.dispatch.attempt,
                             answer_message_id_for(self.dispatch.run_id), self.execution_id,
                             settings.worker.delta_coalesce_ms / 1000, settings.policy.max_output_bytes)

    @property
    def attempt(self) -> int:
        """The attempt number this execution runs."""
        return self.dispatch.attempt

    def stop(self, reason: Stop) -> None:
        """Stop the execution for `reason` (a shutdown lets an outcome report finish)."""
        if self.stop_reason is not None or self.task is None or self.task.done():
            return
        if reason is Stop.SHUTDOWN and self.reporting:
            return  # let the outcome report finish
        self.stop_reason = reason
        self.task.cancel()

    @property
    def finished(self) -> bool:
        """Whether the group may move past this dispatch."""
        return self.outcome_acked or self.stop_reason in (Stop.SUPERSEDED, Stop.INTERRUPTED)

    async def run(self) -> None:
        """Run the agent, stream its answer and report the outcome."""
        self.started = True
        self.last_progress = time.monotonic()
        queue: asyncio.Queue[object] = asyncio.Queue()
        self._synced = asyncio.get_running_loop().create_future()
        if self.fresh:
            self._synced.set_result([])
        pump = asyncio.create_task(self._pump(queue))
        beat = asyncio.create_task(self._heartbeat())
        try:
            await self._report(self._started())
            await self._report(ReportExecutionStarted(
                self.meta.thread_id, self.dispatch.run_id, self.attempt, self.outlet.worker_id,
                self.execution_id, now_ms()))
            text, steps, citations = await self._stream(queue)
            self.reporting = True
            await self._outcome(self._completed(text, steps, citations))
        except InterruptRequested as request:
            # The run waits for a human: report the interrupt as the run's next step (no
            # output yet) and end; a resume dispatches the attempt again.
            self.reporting = True
            await self._emit(self.answer.end_interrupted())
            entry = JournalEntry(request.step, INTERRUPT, INTERRUPT, request.payload_json, "",
                                 self.execution_id)
            await self._outcome(ReportStepCompleted(
                self.meta.thread_id, self.dispatch.run_id, self.attempt, self.outlet.worker_id,
                entry, now_ms()))
            log.info("run %s attempt %d: interrupted at step %d", self.dispatch.run_id,
                     self.attempt, request.step)
        except Deposed:
            self.stop_reason = Stop.SUPERSEDED
            log.info("run %s attempt %d: execution %s deposed by another execution",
                     self.dispatch.run_id, self.attempt, self.execution_id)
        except AgentError as exc:
            self.reporting = True
            await self._emit(self.answer.end_with_error())
            await self._outcome(self._failed(str(exc), exc.retryable))
        except asyncio.CancelledError:
            if self.stop_reason is Stop.INTERRUPTED and self.started:
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
                self.reporting = True
                answer = self.answer
                await self._outcome(self._completed(answer.text, tuple(answer.steps),
                                                    tuple(answer.citations)))
                return
            if self.stop_reason is not Stop.SHUTDOWN:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self.reporting = True
            await self._emit(self.answer.end_with_error())
            await self._outcome(self._failed(SHUTDOWN_ERROR, True))
        finally:
            for task in (pump, beat):
                task.cancel()
            await asyncio.gather(pump, beat, return_exceptions=True)

    # --- the agent's output -> stream records ---

    async def _pump(self, queue: asyncio.Queue[object]) -> None:
        try:
            if not self.fresh:
                # Redelivered: an earlier execution of this attempt may have recorded steps
                # not decided yet. Learn them before the agent computes anything: a turn
                # computed afresh that the barrier then shows recorded would cost the
                # attempt (`RunContext.record`), and two kills on one run could end it.
                self.journal = merge(self.journal, await self._sync())
            self.context = RunContext(self.dispatch.run_id, self.attempt, self.execution_id,
                                      journal=list(self.journal),
                                      limits=self.outlet.settings.policy.journal,
                                      recorder=self._record_step, durable=self._durable,
                                      sync=self._sync)
            async for output in drive(self.outlet.agent, self.dispatch.history,
                                      self.dispatch.input_text, self.context):
                self.last_progress = time.monotonic()
                queue.put_nowait(output)
            queue.put_nowait(_END)
        except Exception as exc:
            queue.put_nowait(exc)

    async def _stream(
        self, queue: asyncio.Queue[object]
    ) -> tuple[str, tuple[Step, ...], tuple[Citation, ...]]:
        answer = self.answer
        await self._emit(answer.start())
        while True:
            flush_at = answer.flush_at
            if flush_at is not None and self._delta_in_flight(queue):
                flush_at += DELTA_HOLD_MAX_S  # `_DELIVERED` ends the hold sooner
            timeout = None if flush_at is None else max(0.0, flush_at - time.monotonic())
            try:
                # What is queued first, as the awaited get would give it (it takes a
                # queued item without yielding, whatever the timeout): no timer and
                # no coroutine per token of a fast agent.
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    item = await within(queue.get(), timeout)
                except TimeoutError:
                    await self._emit(answer.flush())
                    continue
            if item is _DELIVERED:
                if answer.flush_at is not None and time.monotonic() >= answer.flush_at:
                    await self._emit(answer.flush())
                continue
            if item is _END:
                break
            if isinstance(item, AgentError | Deposed | InterruptRequested):
                await self._emit(answer.close_text())
                raise item
            if isinstance(item, Exception):  # a bug in the agent: worth another attempt
                await self._emit(answer.close_text())
                raise AgentError(f"{type(item).__name__}: {item}", retryable=True) from item
            output: AgentOutput = item  # type: ignore[assignment]
            if isinstance(output, TextChunk):
                if not output.text:
                    continue
                if not answer.spend(output.text):
                    await self._emit(answer.close_text())
                    raise AgentError(OUTPUT_TOO_LARGE, retryable=False)
                await self._emit(answer.add_text(output.text, time.monotonic(),
                                                 hold=self._delta_in_flight(queue)))
            elif isinstance(output, AgentStep):
                await self._emit(answer.close_text())
                step = output.step
                if not answer.spend(step.kind, step.name, step.payload_json):
                    raise AgentError(OUTPUT_TOO_LARGE, retryable=False)
                await self._emit(answer.add_step(step))
            elif isinstance(output, AgentCitations):
                if not answer.spend(*(x for c in output.citations for x in (c.url, c.title))):
                    raise AgentError(OUTPUT_TOO_LARGE, retryable=False)
                answer.add_citations(output.citations)
        await self._emit(answer.end())
        return answer.text, tuple(answer.steps), tuple(answer.citations)

    async def _emit(self, outputs: list[StreamOutput]) -> None:
        for output in outputs:
            meta = new_meta(self.meta.thread_id, self.meta.tenant, now_ms(),
                            self.meta.traceparent, self.meta.tracestate)
            delivery = await self.outlet.stream(output, meta, self.partition)
            if isinstance(output.payload, TextDelta):
                self._delta_sent, self._woken = delivery, False

    def _delta_in_flight(self, queue: asyncio.Queue[object]) -> bool:
        """Whether the last text delta is not delivered yet; if so, its delivery puts
        `_DELIVERED` on `queue`. Deltas wait for the previous one (at most
        `DELTA_HOLD_MAX_S` past their coalescing time): under load the agent's tokens come
        further apart than `delta_coalesce_ms` and each would be a record of its own,
        more records to write and read as the worker falls behind (issue #22)."""
        sent = self._delta_sent
        if sent is None or sent.done():
            return False
        if not self._woken:
            self._woken = True
            sent.add_done_callback(lambda _: queue.put_nowait(_DELIVERED))
        return True

    # --- reports ---

    async def _heartbeat(self) -> None:
        settings = self.outlet.settings
        interval = max(settings.worker.heartbeat_interval_ms / 1000, 0.05)
        stall_s = max(2 * interval, settings.policy.heartbeat_timeout_ms / 2000)
        stalled = False
        while True:
            await asyncio.sleep(interval)
            if self.context is not None and self.context.in_tool:
                self.last_progress = time.monotonic()  # a tool at work is progress
            if time.monotonic() - self.last_progress > stall_s:
                if not stalled:
                    log.warning("run %s attempt %d: no agent output for %.1fs; heartbeats paused",
                                self.dispatch.run_id, self.attempt, stall_s)
                stalled = True
                continue
            stalled = False
            await self._report(ReportHeartbeat(self.meta.thread_id, self.dispatch.run_id,
                                               self.attempt, self.outlet.worker_id, now_ms()))

    # --- the step journal ---

    def execution_started(self, execution_id: str, journal: list[JournalEntry]) -> None:
        """The watch read an `execution_started` of the run, with the steps known then."""
        if execution_id == self.execution_id and self._synced is not None \
                and not self._synced.done():
            self._synced.set_result(journal)

    async def _sync(self) -> list[JournalEntry]:
        """The barrier: wait for this execution's `ExecutionStarted` (every report before
        it is decided by then), beating meanwhile; the run's steps known at that point."""
        assert self._synced is not None
        if not self._synced.done():
            log.info("run %s attempt %d: execution %s waits until its start is decided",
                     self.dispatch.run_id, self.attempt, self.execution_id)
        while True:
            self.last_progress = time.monotonic()
            try:
                return await within(asyncio.shield(self._synced), 1.0)
            except TimeoutError:
                continue

    def step_recorded(self, entry: JournalEntry) -> None:
        """The watch read that the run's step `entry.step` was recorded: by another
        execution, where this one reported that step too, this one is deposed."""
        self._seen.setdefault(entry.step, entry)
        if entry.step in self._reported and entry.execution_id != self.execution_id:
            log.info("run %s attempt %d: execution %s deposed: step %d was recorded by %s",
                     self.dispatch.run_id, self.attempt, self.execution_id, entry.step,
                     entry.execution_id)
            self.stop(Stop.SUPERSEDED)

    async def _record_step(self, entry: JournalEntry) -> None:
        """Send the step's report; `_durable` learns when the broker acks it (see the
        module's docstring)."""
        seen = self._seen.get(entry.step)
        if seen is not None and seen.execution_id != self.execution_id:
            raise Deposed(f"step {entry.step} was recorded by execution {seen.execution_id}")
        report = ReportStepCompleted(self.meta.thread_id, self.dispatch.run_id, self.attempt,
                                     self.outlet.worker_id, entry, now_ms())
        self._reported.add(entry.step)
        self._unacked.append((report, await self._send_step(report)))

    async def _durable(self) -> None:
        """The fence: every step this execution reported is acked. A report that failed
        is sent again with every one after it, in order: the processor drops a step
        past a gap, so a later report's ack proves nothing about an earlier one."""
        async with self._fence_lock:
            for attempt in range(OUTCOME_SEND_TRIES):
                try:
                    while self._unacked:
                        await asyncio.shield(self._unacked[0][1])
                        self._unacked.popleft()
                    self.last_progress = time.monotonic()
                    self._check_next_step()
                    return
                except KafkaError as exc:
                    log.warning("step report for run %s failed (%s); sending again",
                                self.dispatch.run_id, exc)
                    await asyncio.sleep(0.5 * 2**attempt)
                    self._unacked = deque([(report, await self._send_step(report))
                                           for report, _ in self._unacked])
            raise AgentError("the run's steps could not be reported", retryable=True)

    def _check_next_step(self) -> None:
        """Before a side effect (the fence): if the watch has read that the step this
        execution is about to take was recorded by another execution, this one is
        deposed now, not after calling the tool again (docs/chaos.md, seed 3011: a
        revoked execution recorded a step after this one's barrier, and this one's
        watch had read it). A step this execution's journal holds is one it replays, not
        one it takes: an interrupt answered by a resume (`RESUMED_BY`), inside the tool
        that asked it, whose record the watch read after this execution started."""
        context = self.context
        if context is None:
            return
        step = context.cursor
        seen = self._seen.get(step)
        if seen is not None and seen.execution_id != self.execution_id and not (
                step < len(context.journal) and context.journal[step] == seen):
            raise Deposed(f"step {step} was recorded by execution {seen.execution_id}")

    async def _send_step(self, report: ReportStepCompleted) -> asyncio.Future[Any]:
        try:
            return await self._report(report)
        except KafkaError as exc:  # not even queued: the fence sends it again
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            failed.exception()  # retrieved: the fence deals with it
            return failed

    async def _report(self, command: Command) -> asyncio.Future[Any]:
        meta = new_meta(self.meta.thread_id, self.meta.tenant, now_ms(),
                        self.meta.traceparent, self.meta.tracestate)
        return await self.outlet.command(command, meta, self.partition)

    async def _outcome(self, command: ReportAttemptCompleted | ReportAttemptFailed
                       | ReportStepCompleted) -> None:
        """Send the outcome report, after the steps', until the broker acks it."""
        try:
            await self._durable()
        except AgentError as exc:  # the outcome goes anyway: it is the run's answer
            log.warning("run %s attempt %d: %s", self.dispatch.run_id, self.attempt, exc)
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
                                    self.outlet.worker_id, now_ms())

    def _completed(self, text: str, steps: tuple[Step, ...],
                   citations: tuple[Citation, ...]) -> ReportAttemptCompleted:
        return ReportAttemptCompleted(self.meta.thread_id, self.dispatch.run_id, self.attempt,
                                      self.outlet.worker_id, text, steps, citations, now_ms())

    def _failed(self, error: str, retryable: bool) -> ReportAttemptFailed:
        return ReportAttemptFailed(self.meta.thread_id, self.dispatch.run_id, self.attempt,
                                   self.outlet.worker_id, error, retryable, now_ms())


def _log_failed_delivery(delivery: asyncio.Future[Any]) -> None:
    if not delivery.cancelled() and delivery.exception() is not None:
        log.warning("a record was not delivered: %s", delivery.exception())
