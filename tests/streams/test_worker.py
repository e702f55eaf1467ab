"""The agent worker against the real broker: in-process for the record-level
contract, and as `threadline worker` processes next to a real processor for
retries, cancellation, kill -9 and redelivery."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from streams.agents import AgentCitations, AgentOutput, AgentStep, TextChunk
from streams.agents.builtin import reply_for
from streams.config import Settings
from streams.domain import (
    AttemptDispatched,
    AttemptStarted,
    CancelRun,
    Citation,
    CreateThread,
    Event,
    PostUserMessage,
    ReportAttemptCompleted,
    ReportAttemptFailed,
    ReportAttemptStarted,
    RetryScheduled,
    RunCancelled,
    RunCompleted,
    RunFailed,
    Step,
)
from streams.records import (
    CitationsOutput,
    Dispatch,
    HistoryMessage,
    MessageEnd,
    MessageStart,
    RunLifecycle,
    StepOutput,
    StreamOutput,
    TextDelta,
    TextEnd,
    TextStart,
)
from streams.serialization import (
    EnvelopeMeta,
    decode_command,
    decode_event,
    decode_state,
    decode_stream,
    encode_dispatch,
    new_meta,
)
from streams.thread import answer_message_id_for, run_id_for
from streams.topics import ensure_topics
from streams.worker import SHUTDOWN_ERROR, Fate, PartitionOffsets, Worker
from tests.kafka_helpers import RoleProcess, command_producer, read_topic, send_command, wait_for


def _now() -> int:
    return int(time.time() * 1000)


# --- pure bookkeeping ---------------------------------------------------------------------


def test_commit_position_is_the_lowest_running_offset() -> None:
    offsets = PartitionOffsets()
    assert offsets.position() is None
    for o in (5, 6, 7):
        assert offsets.take(o)
    assert offsets.position() == 5
    offsets.finish(6)
    assert offsets.position() == 5  # 5 still runs: 6 may not be committed past it
    offsets.finish(5)
    assert offsets.position() == 7
    offsets.finish(7)
    assert offsets.position() == 8
    # Fetched again after a rebalance: neither running nor finished records run twice.
    assert not offsets.take(6) and not offsets.take(7)
    assert offsets.take(9) and not offsets.take(9)
    assert offsets.position() == 9


def test_records_fetched_again_while_an_earlier_one_runs_are_not_taken_twice() -> None:
    offsets = PartitionOffsets()
    for o in (1, 2, 3):
        offsets.take(o)
    offsets.finish(3)
    assert offsets.position() == 1
    assert [offsets.take(o) for o in (1, 2, 3, 4)] == [False, False, False, True]


def test_fate_kills_attempts_the_lifecycle_says_are_over() -> None:
    fate = Fate()
    fate.learn("run_accepted", 0)
    fate.learn("attempt_dispatched", 1)
    assert not fate.kills(1)
    fate.learn("retry_scheduled", 1)
    assert fate.kills(1) and not fate.kills(2)
    fate.learn("attempt_dispatched", 3)
    assert fate.kills(2) and not fate.kills(3)
    fate.learn("run_cancelled", 0)  # cancellations carry attempt 0
    assert fate.kills(3) and fate.kills(9)


# --- reading topics with positions ------------------------------------------------------------


@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    meta: EnvelopeMeta
    out: StreamOutput

    @property
    def execution(self) -> str:
        return self.out.part_id.split(":")[0]


def _read_stream(settings: Settings, until: Callable[[list[Rec]], bool],
                 timeout: float = 60) -> list[Rec]:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"r-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "log_level": 3})
    topic = settings.topics.stream
    md = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
    records: list[Rec] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.2):
                if msg.error():
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(msg.error())
                    continue
                meta, out = decode_stream(msg.value())
                records.append(Rec(msg.partition(), msg.offset(), meta, out))
            if until(records):
                break
        return records
    finally:
        consumer.close()


def _output_of(records: Sequence[Rec], run_id: str) -> list[Rec]:
    """A run's worker output (not the lifecycle mirror), in partition order."""
    return sorted((r for r in records if r.out.run_id == run_id and r.out.part_id != "lifecycle"),
                  key=lambda r: r.offset)


def _lifecycle(records: Sequence[Rec], run_id: str, event: str) -> list[Rec]:
    return [r for r in records if r.out.run_id == run_id and isinstance(r.out.payload, RunLifecycle)
            and r.out.payload.event == event]


def _events(settings: Settings, until: Callable[[list[Event]], bool],
            timeout: float = 60) -> list[Event]:
    return read_topic(settings, settings.topics.events, lambda b: decode_event(b)[1],
                      until=until, timeout=timeout)


def _of_run(events: Sequence[Event], run_id: str) -> list[Event]:
    return [e for e in events if getattr(e, "run_id", None) == run_id]


def _kinds(records: Sequence[Rec]) -> str:
    return " ".join(type(r.out.payload).__name__ for r in records)


def _committed(settings: Settings, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap,
                         "group.id": f"{settings.topic_prefix}worker", "log_level": 3})
    try:
        tp = TopicPartition(settings.topics.dispatch, partition)
        return int(consumer.committed([tp], timeout=10)[0].offset)
    finally:
        consumer.close()


# --- in-process: the record-level contract ------------------------------------------------------


class ScriptedAgent:
    """Yields a fixed script at once; `hang` then waits forever."""

    def __init__(self, script: Sequence[AgentOutput], hang: bool = False) -> None:
        self.script, self.hang = script, hang
        self.calls: list[tuple[Sequence[HistoryMessage], str]] = []

    async def run(self, history: Sequence[HistoryMessage],
                  message: str) -> AsyncIterator[AgentOutput]:
        self.calls.append((history, message))
        for output in self.script:
            yield output
        if self.hang:
            await asyncio.Event().wait()

    async def aclose(self) -> None:
        return None


def _dispatch(settings: Settings, thread: str, partition: int, text: str = "question") -> Dispatch:
    dispatch = Dispatch(run_id=run_id_for(thread, "m1"), message_id="m1", attempt=1,
                        workflow_id=f"agent-{thread}", input_text=text,
                        history=(HistoryMessage("m0", "user", "before"),),
                        dispatched_at_ms=_now())
    producer = Producer({"bootstrap.servers": settings.bootstrap})
    producer.produce(settings.topics.dispatch, encode_dispatch(dispatch, new_meta(thread, "acme", _now())),
                     thread.encode(), partition=partition)
    producer.flush(10)
    return dispatch


def _reports(settings: Settings, until: Callable[[list[Any]], bool]) -> list[Any]:
    return read_topic(settings, settings.topics.commands, lambda b: decode_command(b)[1],
                      until=until, timeout=30)


@pytest.mark.kafka
async def test_one_attempt_streams_coalesced_parts_and_reports_in_process(settings: Settings) -> None:
    ensure_topics(settings)
    thread = f"th-{uuid.uuid4()}"
    dispatch = _dispatch(settings, thread, partition=2)
    script: list[AgentOutput] = [TextChunk(c) for c in "x" * 300]
    script += [AgentStep(Step("tool_call", "calc", "{}")), TextChunk("after"), TextChunk(" step"),
               AgentCitations((Citation("https://a", "A"),))]
    agent = ScriptedAgent(script)
    stop = asyncio.Event()
    worker = Worker(settings.with_(delta_coalesce_ms=20), agent, worker_id="w-inproc")
    task = asyncio.create_task(worker.run(stop))
    try:
        reports = await asyncio.to_thread(
            _reports, settings, lambda r: any(isinstance(c, ReportAttemptCompleted) for c in r))
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert [type(c).__name__ for c in reports][:1] == ["ReportAttemptStarted"]
    done = next(c for c in reports if isinstance(c, ReportAttemptCompleted))
    assert (done.run_id, done.attempt, done.worker_id) == (dispatch.run_id, 1, "w-inproc")
    assert done.final_text == "x" * 300 + "after step"
    assert done.steps == (Step("tool_call", "calc", "{}"),)
    assert done.citations == (Citation("https://a", "A"),)
    assert agent.calls == [((HistoryMessage("m0", "user", "before"),), "question")]

    records = await asyncio.to_thread(
        _read_stream, settings, lambda r: any(isinstance(x.out.payload, MessageEnd) for x in r))
    out = _output_of(records, dispatch.run_id)
    assert {r.partition for r in out} == {2}  # the dispatch's partition, whatever the key hashes to
    assert [r.out.seq for r in out] == list(range(len(out)))
    assert re.fullmatch(r"MessageStart TextStart (TextDelta )+TextEnd StepOutput TextStart "
                        r"(TextDelta )+TextEnd CitationsOutput MessageEnd", _kinds(out)), _kinds(out)
    deltas = [r for r in out if isinstance(r.out.payload, TextDelta)]
    assert len(deltas) < 100  # 302 chunks, coalesced
    first_part = [r.out.payload.delta for r in deltas if r.out.part_id.endswith(":text:0")]
    assert "".join(first_part) == "x" * 300
    ends = [r.out.payload.text for r in out if isinstance(r.out.payload, TextEnd)]
    assert ends == ["x" * 300, "after step"]
    assert len({r.execution for r in out}) == 1
    assert {r.out.message_id for r in out} == {answer_message_id_for(dispatch.run_id)}
    assert {(r.meta.thread_id, r.meta.tenant) for r in out} == {(thread, "acme")}
    assert _committed(settings, 2) == 1


@pytest.mark.kafka
async def test_shutdown_reports_running_attempts_failed_retryable_and_commits(
    settings: Settings,
) -> None:
    ensure_topics(settings)
    thread = f"th-{uuid.uuid4()}"
    dispatch = _dispatch(settings, thread, partition=1)
    stop = asyncio.Event()
    worker = Worker(settings, ScriptedAgent([TextChunk("partial")], hang=True), worker_id="w-stop")
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.to_thread(_read_stream, settings,
                                lambda r: any(isinstance(x.out.payload, TextDelta) for x in r))
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    reports = await asyncio.to_thread(
        _reports, settings, lambda r: any(isinstance(c, ReportAttemptFailed) for c in r))
    failed = next(c for c in reports if isinstance(c, ReportAttemptFailed))
    assert (failed.run_id, failed.error, failed.retryable) == (dispatch.run_id, SHUTDOWN_ERROR, True)
    records = await asyncio.to_thread(
        _read_stream, settings, lambda r: any(isinstance(x.out.payload, MessageEnd) for x in r))
    out = _output_of(records, dispatch.run_id)
    assert isinstance(out[-1].out.payload, MessageEnd) and out[-1].out.payload.finish_reason == "error"
    assert _committed(settings, 1) == 1
