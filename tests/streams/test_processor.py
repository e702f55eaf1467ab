"""The processor through Kafka alone: a producer that knows only the schemas and
topic names drives threads; a read_committed reader sees the decisions."""

from __future__ import annotations

import collections
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Message, Producer

from streams.config import Settings
from streams.core.domain import (
    AttemptDispatched,
    CreateThread,
    PostUserMessage,
    RejectReason,
    ReportAttemptCompleted,
    ReportAttemptStarted,
    ReportHeartbeat,
    RetryScheduled,
    RunAccepted,
    RunCompleted,
    RunFailed,
    RunRejected,
    RunStatus,
    ThreadCreated,
)
from streams.core.ids import run_id_for
from streams.core.records import RunLifecycle
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess
from streams.wire import LIFECYCLE_HEADER, Codec, header_value, new_meta, payload_named
from tests.conftest import SettingsFactory
from tests.kafka_helpers import (
    command_producer,
    marked,
    read_messages,
    read_topic,
    send_command,
    send_marker,
)

CODEC = Codec()  # single-object records, as the roles write them without a registry

pytestmark = pytest.mark.kafka


def _now() -> int:
    return int(time.time() * 1000)


def _events(settings: Settings, until: object, timeout: float = 60) -> list[object]:
    records = read_topic(settings, settings.topics.events, lambda b: CODEC.decode_event(b)[1],
                         until=until, timeout=timeout)  # type: ignore[arg-type]
    return list(records)


def _count(kind: type, records: list[object]) -> int:
    return sum(isinstance(r, kind) for r in records)


def test_a_run_goes_from_post_to_completion_through_kafka_alone(
    settings: Settings, processor: RoleProcess
) -> None:
    """A post, its dispatch and the worker's reports, through Kafka alone, complete the run."""
    producer = command_producer(settings)
    thread, msg = f"th-{uuid.uuid4()}", f"m-{uuid.uuid4()}"
    run = run_id_for(thread, msg)
    send_command(producer, settings, CreateThread(thread, "t", "hello", _now()))
    send_command(producer, settings, PostUserMessage(thread, "t", msg, "hi there", None, _now()))
    producer.flush(10)
    events = _events(settings, lambda r: _count(AttemptDispatched, r) >= 1)
    assert [type(e).__name__ for e in events] == [
        "ThreadCreated", "MessageAccepted", "RunAccepted", "AttemptDispatched"], processor.tail()
    dispatches = read_topic(settings, settings.topics.dispatch, CODEC.decode_dispatch,
                            until=lambda r: len(r) >= 1)
    assert [(d.run_id, d.attempt, d.input_text) for _, d in dispatches] == [(run, 1, "hi there")]

    for report in (
        ReportAttemptStarted(thread, run, 1, "w1", _now()),
        ReportHeartbeat(thread, run, 1, "w1", _now()),
        ReportAttemptCompleted(thread, run, 1, "w1", "the answer", (), (), _now()),
        ReportAttemptCompleted(thread, run, 1, "w1", "the answer", (), (), _now()),  # redelivered
    ):
        send_command(producer, settings, report)
    producer.flush(10)
    # A marker after the reports: once it is decided, so is the redelivered report.
    events = _events(settings, marked(send_marker(producer, settings, thread)))
    assert _count(RunCompleted, events) == 1
    completed = next(e for e in events if isinstance(e, RunCompleted))
    assert completed.message.text == "the answer"
    states = read_topic(settings, settings.topics.threads, CODEC.decode_state,
                        until=lambda r: any(s.active_run is None and s.message_count == 2 for s in r))
    assert states[-1].last_run is not None and states[-1].last_run.status is RunStatus.COMPLETED
    # The history: one record per message, the question rewritten with its run's end.
    records = read_topic(settings, settings.topics.messages, CODEC.decode_message,
                         until=lambda r: len(r) >= 3)
    newest = {m.seq: m for _, m in records}
    assert [(newest[i].message.role, newest[i].message.text) for i in (0, 1)] == [
        ("user", "hi there"), ("assistant", "the answer")]
    assert newest[0].run_status is RunStatus.COMPLETED

    # Its lifecycle records name their payload and their event in headers
    # (docs/topics.md): a gateway's feed skips most of them undecoded.
    def named(msg: Message) -> tuple[bytes | None, str, bytes | None, bytes | None]:
        payload = CODEC.decode_stream(msg.value() or b"")[1].payload
        assert isinstance(payload, RunLifecycle)  # nothing else: no worker here
        return (msg.key(), payload.event, payload_named(msg.headers()),
                header_value(msg.headers(), LIFECYCLE_HEADER))

    lifecycle = [r[1:] for r in read_messages(
        settings, settings.topics.stream, named,
        until=lambda r: any(e == "run_completed" for k, e, _, _ in r if k == thread.encode()))
        if r[0] == thread.encode()]
    assert [e for e, _, _ in lifecycle][::len(lifecycle) - 1] == ["run_accepted", "run_completed"]
    assert lifecycle == [(e, b"RunLifecycle", e.encode()) for e, _, _ in lifecycle]


def test_concurrent_posts_to_one_thread_accept_exactly_one(
    settings: Settings, processor: RoleProcess
) -> None:
    """Of 20 posts at once to one thread one is accepted, 19 conflict and a resend is a duplicate."""
    producer = command_producer(settings)
    thread = f"th-{uuid.uuid4()}"
    send_command(producer, settings, CreateThread(thread, "t", "race", _now()))
    for i in range(20):
        send_command(producer, settings, PostUserMessage(thread, "t", f"m{i}", f"post {i}", None, _now()))
    send_command(producer, settings, PostUserMessage(thread, "t", "m0", "post 0", None, _now()))
    producer.flush(10)
    events = _events(settings, lambda r: _count(RunAccepted, r) + _count(RunRejected, r) >= 21)
    rejects = collections.Counter(e.reason for e in events if isinstance(e, RunRejected))
    assert _count(RunAccepted, events) == 1
    assert rejects == {RejectReason.CONFLICT: 19, RejectReason.DUPLICATE: 1}


def test_a_silent_attempt_is_retried_then_failed(
    make_settings: SettingsFactory, test_env: dict[str, str], tmp_path: Path
) -> None:
    """An attempt with no heartbeat is retried once, then the run fails."""
    settings = make_settings(THREADLINE_HEARTBEAT_TIMEOUT_S="1", THREADLINE_RETRY_INITIAL_S="0.2")
    ensure_topics(settings)
    proc = RoleProcess("processor", test_env, tmp_path / "p.log").start()
    try:
        producer = command_producer(settings)
        thread = f"th-{uuid.uuid4()}"
        send_command(producer, settings, CreateThread(thread, "t", "silent", _now()))
        send_command(producer, settings, PostUserMessage(thread, "t", "m", "anyone?", None, _now()))
        producer.flush(10)
        events = _events(settings, lambda r: _count(RunFailed, r) >= 1, timeout=40)
        kinds = [type(e).__name__ for e in events]
        assert kinds == ["ThreadCreated", "MessageAccepted", "RunAccepted", "AttemptDispatched",
                         "RetryScheduled", "AttemptDispatched", "RunFailed"], proc.tail()
        retry = next(e for e in events if isinstance(e, RetryScheduled))
        assert retry.reason == "heartbeat_timeout" and retry.next_attempt == 2
    finally:
        proc.stop()


def test_a_malformed_record_goes_to_the_dead_letter_topic_and_processing_goes_on(
    settings: Settings, processor: RoleProcess
) -> None:
    """Garbage and misrouted commands are dead-lettered, and later commands are still processed."""
    raw = Producer({"bootstrap.servers": settings.bootstrap, "partitioner": "murmur2_random"})
    valid = CODEC.encode_command(CreateThread("th-x", "t", "x", 1), new_meta("th-x", "t", 1))
    garbage = [b"\xc3\x01garbage", b"not avro at all", valid[:-3], b"\xc3\x01" + b"\x00" * 8 + valid[10:]]
    for value in garbage:
        raw.produce(settings.topics.commands, value, b"th-x")
    # A command whose key is not its thread: it would land on another thread's partition.
    raw.produce(settings.topics.commands, valid, b"th-other")
    raw.flush(10)
    producer = command_producer(settings)
    thread = f"th-{uuid.uuid4()}"
    send_command(producer, settings, CreateThread(thread, "t", "after garbage", _now()))
    producer.flush(10)
    events = _events(settings, lambda r: _count(ThreadCreated, r) >= 1)
    assert [e.thread_id for e in events if isinstance(e, ThreadCreated)] == [thread]
    dead = read_topic(settings, settings.topics.dead_letter, CODEC.decode_dead_letter,
                      until=lambda r: len(r) >= 5)
    assert sorted(d.value for d in dead) == sorted([*garbage, valid])
    assert all(d.reason and d.source_topic == settings.topics.commands for d in dead)
    assert any("is not the command's thread_id" in d.reason for d in dead)
    assert not any(isinstance(e, ThreadCreated) and e.thread_id == "th-x" for e in events)


def test_a_deadline_survives_a_processor_kill(
    make_settings: SettingsFactory, test_env: dict[str, str], tmp_path: Path
) -> None:
    """Deadlines are table state, not timers: a processor killed while an attempt is
    pending still reschedules it after a restart."""
    settings = make_settings(THREADLINE_HEARTBEAT_TIMEOUT_S="2", THREADLINE_MAX_ATTEMPTS="1")
    ensure_topics(settings)
    proc = RoleProcess("processor", test_env, tmp_path / "p.log").start()
    try:
        producer = command_producer(settings)
        thread = f"th-{uuid.uuid4()}"
        send_command(producer, settings, CreateThread(thread, "t", "deadline", _now()))
        send_command(producer, settings, PostUserMessage(thread, "t", "m", "still there?", None, _now()))
        producer.flush(10)
        _events(settings, lambda r: _count(AttemptDispatched, r) >= 1)
        proc.kill9()
        time.sleep(3)  # the deadline passes while no processor runs
        proc.start()
        events = _events(settings, lambda r: _count(RunFailed, r) >= 1, timeout=40)
        failed = next(e for e in events if isinstance(e, RunFailed))
        assert failed.error.startswith("heartbeat_timeout"), (failed, proc.tail())
        assert _count(RunFailed, events) == 1
    finally:
        proc.stop()
