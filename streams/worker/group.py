"""The worker's group loop: the dispatch consumer group, and the executions it runs.

Workers share the dispatch topic as the consumer group `{prefix}worker`
(read_committed, manual commits); each dispatch record becomes an asyncio task
that runs one `Execution`, at most `concurrency` at a time (partitions are paused
while all slots are busy).

Offsets: a partition's committed offset is the lowest dispatch still running
(`PartitionOffsets`), so the group only moves past attempts whose outcome report
was acked, or that were superseded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

import streams.observability.worker as observed  # a module: it imports streams.worker too
from streams.agents import Agent
from streams.aio import stop_client
from streams.clock import now_ms
from streams.config import Settings
from streams.core.journal import JournalEntry, merge
from streams.core.lifecycle import RunFate
from streams.core.records import DeadLetter
from streams.heap import freeze_startup_heap
from streams.identity import claim_member_id
from streams.kafka.clients import aiokafka_config
from streams.kafka.liveness import heartbeat_interval_ms, session_timeout_ms
from streams.kafka.topics import ensure_topics
from streams.observability.metrics import worker_metrics
from streams.wire import Codec, DecodeError
from streams.worker.execution import Execution, Outlet, Stop
from streams.worker.offsets import PartitionOffsets
from streams.worker.watch import LifecycleWatch

__all__ = ["Worker"]

log = logging.getLogger("threadline.worker")

PREPARE_TIMEOUT_S = 10.0  # past this, run the dispatch without knowing its run's fate
SHUTDOWN_TIMEOUT_S = 15.0
DEAD_LETTER_MAX_BYTES = 256 * 1024  # of an unreadable dispatch kept in its dead letter


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Commits before partitions move; tells the worker what it owns after."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.worker.commit_offsets()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.worker.assigned({tp.partition for tp in assigned})


class Worker:
    """One worker process's consumer, producer, lifecycle follower and executions."""

    def __init__(self, settings: Settings, agent: Agent, *,
                 concurrency: int | None = None, worker_id: str | None = None,
                 codec: Codec | None = None) -> None:
        self.settings = settings
        # THREADLINE_SCHEMA_REGISTRY_URL: the Confluent format; else single-object.
        self.codec = codec or Codec.from_settings(settings)
        self.agent = observed.ObservedAgent(agent)  # measured (and traced) calls
        # An agent's optional `start()`: what it runs beside the worker from its start,
        # e.g. its MCP servers' sessions (docs/agents.md); `aclose()` stops them.
        self._start_agent = getattr(agent, "start", None)
        self.concurrency = max(1, settings.worker.concurrency if concurrency is None else concurrency)
        # Also the group member id (static membership): a restarted worker takes its
        # dispatch partitions back at once instead of after a rebalance.
        self.worker_id = worker_id or claim_member_id(settings, "w")
        self.partitions: dict[int, PartitionOffsets] = {}
        # Per dispatch partition, the stable end offset when it was last assigned here: a
        # record from there on came to no other member first, so no earlier execution of
        # its attempt can exist and it skips the barrier (docs/agents.md).
        self.fresh_from: dict[int, int] = {}
        self.executions: dict[tuple[int, int], Execution] = {}
        self.by_run: dict[str, set[Execution]] = {}
        self.producer = AIOKafkaProducer(
            **aiokafka_config(settings), client_id=f"worker-{self.worker_id}",
            acks="all", enable_idempotence=True,  # the default partitioner is murmur2
        )
        session_ms = session_timeout_ms(settings)  # the broker's minimum, if higher
        self.consumer = AIOKafkaConsumer(
            **aiokafka_config(settings), client_id=f"worker-{self.worker_id}",
            group_id=settings.group_id("worker"), enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="earliest",
            group_instance_id=self.worker_id, session_timeout_ms=session_ms,
            heartbeat_interval_ms=heartbeat_interval_ms(session_ms),
            fetch_max_wait_ms=100,
        )
        self.watch = LifecycleWatch(settings, f"worker-{self.worker_id}", self._on_fate,
                                    self.codec, self._on_step, self._on_execution)
        self.outlet: Outlet = observed.ObservedOutlet(self.producer, self.codec, settings,
                                                      self.agent, self.worker_id)
        worker_metrics().in_flight.set_function(lambda: len(self.executions))
        self._background: set[asyncio.Task[None]] = set()
        # The lifecycle watch following the assigned partitions: a task, not part of
        # the rebalance callback, because aiokafka sends no heartbeat until that
        # callback returns (a slow one past the session timeout costs the membership).
        self._following: asyncio.Task[None] | None = None
        self._assignment = 0  # assignments so far: a late `_mark_fresh` writes nothing

    async def run(self, stop: asyncio.Event) -> None:
        """Run attempts until `stop` is set, then shut down as the module says."""
        await asyncio.to_thread(ensure_topics, self.settings)
        await asyncio.to_thread(self.codec.register_schemas)  # blocking HTTP: off the loop
        await self.producer.start()
        if callable(self._start_agent):
            self._start_agent()
        await self.watch.start()
        self.consumer.subscribe([self.settings.topics.dispatch], listener=_Rebalance(self))
        await self.consumer.start()
        log.info("worker %s started on %s (concurrency %d)", self.worker_id,
                 self.settings.bootstrap, self.concurrency)
        freeze_startup_heap()
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
        await self.commit_offsets()

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
        meta = observed.with_record_parent(meta, record.headers)  # the processor's decision, if traced
        if now_ms() - dispatch.dispatched_at_ms > self.settings.policy.attempt_timeout_ms:
            # The processor has timed this attempt out already.
            offsets.finish(record.offset)
            return
        execution = Execution(self.outlet, partition, record.offset, offsets, record.timestamp,
                              meta, dispatch,
                              fresh=record.offset >= self.fresh_from.get(partition, 2**63))
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
                            error_type="DecodeError", failed_at_ms=now_ms())
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

    async def _execute(self, execution: Execution) -> None:
        run_id, attempt = execution.dispatch.run_id, execution.attempt
        observed.bind_attempt(execution)  # this task's log lines name the attempt (JSON logs)
        try:
            if self._following is not None:  # as the rebalance callback was awaited before
                await asyncio.shield(self._following)
            try:
                async with asyncio.timeout(PREPARE_TIMEOUT_S):
                    await self.watch.prepare(execution.partition, execution.timestamp_ms)
            except TimeoutError:
                log.warning("run %s attempt %d: lifecycle records not read in %.0fs; running it "
                            "anyway", run_id, attempt, PREPARE_TIMEOUT_S)
            fate = self.watch.fate(run_id)
            if fate is not None and fate.kills(attempt):
                execution.stop_reason = Stop.SUPERSEDED
                worker_metrics().attempts.inc("stopped", Stop.SUPERSEDED.value)
                log.info("run %s attempt %d: not started (over already)", run_id, attempt)
                return
            # The steps completed so far: earlier attempts' (in the dispatch) and this
            # attempt's earlier executions' (recorded since the dispatch, read by the watch).
            execution.journal = merge(execution.dispatch.journal, self.watch.journal_of(run_id))
            log.info("run %s attempt %d: execution %s started (%d journaled steps)", run_id,
                     attempt, execution.execution_id, len(execution.journal))
            with observed.attempt_span(execution):
                await execution.run()
            log.info("run %s attempt %d: execution %s reported", run_id, attempt,
                     execution.execution_id)
        except asyncio.CancelledError:
            if execution.stop_reason is None:
                raise
            if execution.stop_reason is not Stop.SHUTDOWN or not execution.started:
                worker_metrics().attempts.inc("stopped", execution.stop_reason.value)
            if execution.started:
                log.info("run %s attempt %d: execution %s stopped (%s)", run_id, attempt,
                         execution.execution_id, execution.stop_reason.value)
            else:
                log.info("run %s attempt %d: not started (%s)", run_id, attempt,
                         execution.stop_reason.value)
        except Exception:
            worker_metrics().attempts.inc("broke", "exception")
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

    def _on_execution(self, run_id: str, execution_id: str) -> None:
        for execution in list(self.by_run.get(run_id, ())):
            execution.execution_started(execution_id, self.watch.journal_of(run_id))

    def _on_step(self, run_id: str, entry: JournalEntry) -> None:
        for execution in list(self.by_run.get(run_id, ())):
            execution.step_recorded(entry)

    def _on_fate(self, run_id: str, fate: RunFate) -> None:
        for execution in list(self.by_run.get(run_id, ())):
            if fate.kills(execution.attempt):
                execution.stop(Stop.INTERRUPTED if fate.interrupted_attempt == execution.attempt
                               else Stop.SUPERSEDED)

    async def commit_offsets(self) -> None:
        """Commit the dispatch offsets every execution before them has reported."""
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

    async def assigned(self, partitions: set[int]) -> None:
        """The dispatch partitions this worker owns now: stop the executions of the others."""
        for partition in set(self.partitions) - partitions:
            for execution in [e for (p, _), e in self.executions.items() if p == partition]:
                execution.stop(Stop.REVOKED)
            del self.partitions[partition]
        for partition in partitions - set(self.partitions):
            self.partitions[partition] = PartitionOffsets()
        # The bounds of the last assignment no longer hold (see `_mark_fresh`): until
        # the new ones are read, every dispatch waits at its barrier.
        self.fresh_from = {}
        self._assignment += 1
        self._following = asyncio.create_task(
            self._follow(partitions, self._following, self._assignment))
        log.info("assigned dispatch partitions %s", sorted(partitions))

    async def _follow(self, partitions: set[int], previous: asyncio.Task[None] | None,
                      assignment: int) -> None:
        """After the previous assignment's follow: where fresh dispatches begin, then
        the watch follows `partitions`."""
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous
        await self._mark_fresh(partitions, assignment)
        try:
            await self.watch.follow(partitions)
        except Exception:
            log.exception("following lifecycle partitions %s", sorted(partitions))

    async def _mark_fresh(self, partitions: set[int], assignment: int) -> None:
        """Where each assigned partition's fresh records begin: its last stable offset
        once assigned (read_committed; read later, it is only higher), on every
        assignment, kept partitions too (a member that was dropped from the group and
        let back in keeps them in its own eyes). The previous owner stopped reading at
        its revocation or died; a record not yet committed then was read by nobody.
        Unknown, or an assignment since: every record waits at the barrier."""
        topic = self.settings.topics.dispatch
        try:
            # The watch's offsets client: on this consumer's connection the query would
            # wait behind its parked fetch.
            ends = await self.watch.offsets.end_offsets(
                [TopicPartition(topic, p) for p in partitions])
        except KafkaError as exc:
            log.warning("dispatch end offsets unknown (%s): every dispatch waits at its "
                        "barrier until the next assignment", exc)
            return
        if assignment == self._assignment:
            self.fresh_from = {tp.partition: offset for tp, offset in ends.items()}

    async def _shutdown(self) -> None:
        log.info("worker %s stopping: %d attempts in flight", self.worker_id, len(self.executions))
        tasks = [e.task for e in self.executions.values() if e.task is not None]
        for execution in list(self.executions.values()):
            execution.stop(Stop.SHUTDOWN)
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_TIMEOUT_S)
        if self._following is not None:
            self._following.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._following
        await self.commit_offsets()
        closers: tuple[Callable[[], Awaitable[None]], ...] = (
            partial(stop_client, self.consumer), self.watch.stop,
            partial(stop_client, self.producer), self.agent.aclose)
        for close in closers:
            try:
                await close()
            except Exception:
                log.exception("closing %s", close)
        log.info("worker %s stopped", self.worker_id)
