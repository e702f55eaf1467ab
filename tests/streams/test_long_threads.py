"""Long conversations: the decision state stays bounded, the history is stored per
message and complete, and no record outgrows the broker, whatever the input.

Turns are sent as commands straight to Kafka with the worker's part played by the
test (its completion reports), so a 2,000-turn thread takes seconds: a post and its
completion are pipelined, because run ids are derived from message ids.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Producer

from gateway.kafka import partition_for
from streams.config import Settings
from streams.core.domain import (
    CreateThread,
    PostUserMessage,
    ReportAttemptCompleted,
    RunCompleted,
    RunFailed,
    RunStatus,
    ThreadState,
)
from streams.core.history import parse_message_key
from streams.core.ids import run_id_for
from streams.core.records import MessageRecord
from streams.core.thread import OUTPUT_TOO_LARGE
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess
from streams.wire import Codec
from tests.kafka_helpers import (
    command_producer,
    flush_all,
    keys_to_end,
    read_topic,
    send_command,
)

CODEC = Codec()  # single-object records, as the roles write them without a registry

pytestmark = pytest.mark.kafka

MAX_KEYS = 16


def _now() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def env(test_env: dict[str, str]) -> dict[str, str]:
    """The test environment with a small cap on idempotency keys kept."""
    test_env["THREADLINE_MAX_IDEMPOTENCY_KEYS"] = str(MAX_KEYS)
    return test_env


@pytest.fixture
def processor(env: dict[str, str], tmp_path: Path) -> Iterator[RoleProcess]:
    """A processor role process on the test topics."""
    ensure_topics(Settings.from_env(env))
    proc = RoleProcess("processor", env, tmp_path / "processor.log").start()
    yield proc
    proc.stop()


def _turns(producer: Producer, settings: Settings, thread: str, texts: list[tuple[str, str]],
           start: int = 0) -> list[str]:
    """Post each (question, answer) and complete its run at once; the message ids."""
    ids = []
    for i, (question, answer) in enumerate(texts, start):
        message_id = f"m-{i}"
        ids.append(message_id)
        send_command(producer, settings, PostUserMessage(thread, "t", message_id, question,
                                                         f"key-{i}", _now()))
        send_command(producer, settings, ReportAttemptCompleted(
            thread, run_id_for(thread, message_id), 1, "w", answer, (), (), _now()))
    return ids


def _history(settings: Settings, thread: str, count: int) -> dict[int, MessageRecord]:
    """The newest record of each seq of the thread, once `count` seqs are answered."""
    def newest(records: list[tuple[bytes, bytes | None]]) -> dict[int, MessageRecord]:
        found: dict[int, MessageRecord] = {}
        for key, value in records:
            owner, seq = parse_message_key(key)
            if owner == thread and value is not None:
                found[seq] = CODEC.decode_message(value)[1]
        return found

    raw = _read_keyed(settings, settings.topics.messages, lambda got: sum(
        1 for m in newest(got).values()
        if m.message.role == "user" and m.run_status is RunStatus.COMPLETED) >= count // 2)
    return newest(raw)


def _read_keyed(settings: Settings, topic: str, until: object) -> list[tuple[bytes, bytes | None]]:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"r-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "log_level": 3})
    md = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
    got: list[tuple[bytes, bytes | None]] = []
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.2):
                error = msg.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    continue
                got.append((msg.key() or b"", msg.value()))
            if until(got):  # type: ignore[operator]
                return got
        raise AssertionError(f"{topic}: the condition never held ({len(got)} records read)")
    finally:
        consumer.close()


def _states(settings: Settings, thread: str, until_count: int) -> list[ThreadState]:
    states = read_topic(settings, settings.topics.threads, CODEC.decode_state, until=lambda r: any(
        s.thread_id == thread and s.message_count >= until_count and s.active_run is None
        for s in r), timeout=180)
    return [s for s in states if s.thread_id == thread]


def test_two_thousand_turns_keep_the_state_bounded_and_the_history_whole(
    env: dict[str, str], processor: RoleProcess
) -> None:
    """After 2,000 turns the state stays small, every message is stored, and old ids are still duplicates."""
    settings = Settings.from_env(env)
    producer = command_producer(settings)
    thread, short = f"long-{uuid.uuid4()}", f"short-{uuid.uuid4()}"
    for t in (thread, short):
        send_command(producer, settings, CreateThread(t, "t", "a long one", _now()))
    turns = 2_000
    _turns(producer, settings, short, [(f"question {i}", f"answer {i}") for i in range(10)])
    _turns(producer, settings, thread, [(f"question {i}", f"answer {i}") for i in range(turns)])
    flush_all(producer)

    at_10 = _states(settings, short, 20)[-1]
    final = _states(settings, thread, 2 * turns)[-1]
    assert (final.message_count, final.run_count) == (2 * turns, turns)
    assert final.last_run is not None and final.last_run.status is RunStatus.COMPLETED
    # The state at turn 2,000 is no larger than at turn 10 plus the idempotency cap
    # (the counters' varints may grow by a few bytes).
    one_key = dict(list(final.idempotency.items())[:1])
    per_key = len(CODEC.encode_state(replace(final, idempotency=one_key))) - \
        len(CODEC.encode_state(replace(final, idempotency={})))
    assert len(final.idempotency) == MAX_KEYS
    assert len(CODEC.encode_state(final)) <= len(CODEC.encode_state(at_10)) + MAX_KEYS * per_key + 8

    history = _history(settings, thread, 2 * turns)
    assert sorted(history) == list(range(2 * turns)), "a message is missing"
    for i in range(turns):
        question, answer = history[2 * i], history[2 * i + 1]
        assert (question.message.role, question.message.text) == ("user", f"question {i}")
        assert question.run_status is RunStatus.COMPLETED
        assert (answer.message.role, answer.message.text) == ("assistant", f"answer {i}")
    # A resend of an old message id, long out of the idempotency window's count, is
    # still a duplicate: it starts no run.
    send_command(producer, settings, PostUserMessage(thread, "t", "m-3", "question 3", None, _now()))
    send_command(producer, settings, PostUserMessage(thread, "t", "marker", "marker", None, _now()))
    flush_all(producer)
    events = read_topic(settings, settings.topics.events, lambda b: CODEC.decode_event(b)[1],
                        until=lambda r: any(getattr(e, "message_id", None) == "marker" for e in r),
                        timeout=120)
    rejected = [e for e in events if getattr(e, "message_id", None) == "m-3"
                and type(e).__name__ == "RunRejected"]
    assert [e.reason.value for e in rejected] == ["duplicate"]  # type: ignore[union-attr]
    # The newest dispatches carry a bounded context, however long the thread.
    dispatches = read_topic(settings, settings.topics.dispatch, CODEC.decode_dispatch,
                            until=lambda r: len(r) >= turns + 1, timeout=120)
    assert max(len(d.history) for _, d in dispatches) <= 50
    assert processor.alive() and processor.tail(400).count("processor ") == 1  # never restarted


def test_thirty_kilobyte_messages_past_five_megabytes_of_history(
    env: dict[str, str], processor: RoleProcess
) -> None:
    """A thread of 30 KB messages grows past 5 MB of history with every message stored whole."""
    settings = Settings.from_env(env)
    producer = command_producer(settings)
    thread = f"big-{uuid.uuid4()}"
    send_command(producer, settings, CreateThread(thread, "t", "big turns", _now()))
    turns = 90  # 90 x 2 x 30 KB: 5.4 MB of history (the old state record died near 1 MB)
    texts = [(f"q{i} " + "é" * 15_000, f"a{i} " + "x" * 30_000) for i in range(turns)]
    _turns(producer, settings, thread, texts)
    flush_all(producer)
    _states(settings, thread, 2 * turns)
    history = _history(settings, thread, 2 * turns)
    assert sorted(history) == list(range(2 * turns))
    assert sum(len(m.message.text.encode()) for m in history.values()) > 5_000_000
    assert [history[2 * i].message.text for i in range(turns)] == [q for q, _ in texts]
    assert [history[2 * i + 1].message.text for i in range(turns)] == [a for _, a in texts]
    dispatches = read_topic(settings, settings.topics.dispatch, CODEC.decode_dispatch,
                            until=lambda r: len(r) >= turns, timeout=120)
    # THREADLINE_CONTEXT_CHARS (100,000) bounds the history each attempt carries.
    assert max(sum(len(h.text) for h in d.history) for _, d in dispatches) <= 100_000
    assert processor.alive()


def test_an_answer_that_cannot_fit_is_dead_lettered_and_the_thread_goes_on(
    env: dict[str, str], processor: RoleProcess
) -> None:
    """An answer too large to store is dead-lettered, and the thread and others go on."""
    settings = Settings.from_env(env)
    producer = command_producer(settings)
    thread, other = f"huge-{uuid.uuid4()}", f"other-{uuid.uuid4()}"
    for t in (thread, other):
        send_command(producer, settings, CreateThread(t, "t", "x", _now()))
    send_command(producer, settings, PostUserMessage(thread, "t", "m-0", "write a lot", None, _now()))
    too_big = "y" * 700_000  # over max_output_bytes (512 KiB), under the command's own limit
    send_command(producer, settings, ReportAttemptCompleted(
        thread, run_id_for(thread, "m-0"), 1, "w", too_big, (), (), _now()))
    _turns(producer, settings, thread, [("again", "fine")], start=1)
    _turns(producer, settings, other, [("hello", "hi")])
    flush_all(producer)
    events = read_topic(settings, settings.topics.events, lambda b: CODEC.decode_event(b)[1],
                        until=lambda r: sum(isinstance(e, RunCompleted) for e in r) >= 2,
                        timeout=120)
    failed = [e for e in events if isinstance(e, RunFailed)]
    assert [(e.thread_id, e.error) for e in failed] == [(thread, OUTPUT_TOO_LARGE)]
    assert {e.thread_id for e in events if isinstance(e, RunCompleted)} == {thread, other}
    letters = read_topic(settings, settings.topics.dead_letter, CODEC.decode_dead_letter,
                         until=lambda r: len(r) >= 1)
    assert letters[0].reason.startswith(OUTPUT_TOO_LARGE) and letters[0].error_type == "OutputTooLarge"
    assert processor.alive()


def test_a_decision_over_the_record_limit_is_dead_lettered_not_a_crash(
    env: dict[str, str], tmp_path: Path
) -> None:
    """The generic guard: an operator's record limit below what a command decides
    (here a message larger than the limit, allowed by a raised input cap)."""
    env = {**env, "THREADLINE_MAX_RECORD_BYTES": "65536", "THREADLINE_MAX_INPUT_CHARS": "200000"}
    settings = Settings.from_env(env)
    ensure_topics(settings)
    proc = RoleProcess("processor", env, tmp_path / "processor.log").start()
    try:
        producer = command_producer(settings)
        thread = f"limit-{uuid.uuid4()}"
        send_command(producer, settings, CreateThread(thread, "t", "x", _now()))
        send_command(producer, settings, PostUserMessage(thread, "t", "m-big", "z" * 70_000, None,
                                                         _now()))
        _turns(producer, settings, thread, [("small", "ok")], start=1)
        flush_all(producer)
        events = read_topic(settings, settings.topics.events, lambda b: CODEC.decode_event(b)[1],
                            until=lambda r: any(isinstance(e, RunCompleted) for e in r), timeout=120)
        assert not any(getattr(e, "message_id", None) == "m-big" for e in events)
        letters = read_topic(settings, settings.topics.dead_letter, CODEC.decode_dead_letter,
                             until=lambda r: len(r) >= 1)
        assert "record_too_large" in letters[0].reason
        assert proc.alive()
    finally:
        proc.stop()


def test_after_the_log_cleaner_ran_the_whole_history_reads_back(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Compaction keeps one record per key: every message, never a thread's last only."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    env = {**env, "THREADLINE_DURABLE_REPLAY_S": "1"}
    settings = Settings.from_env(env)
    ensure_topics(settings)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, settings.topics.messages, incremental_configs=[
        ConfigEntry("segment.ms", "300", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("min.cleanable.dirty.ratio", "0.01", incremental_operation=AlterConfigOpType.SET),
    ])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    proc = RoleProcess("processor", env, tmp_path / "processor.log").start()
    try:
        producer = command_producer(settings)
        thread = f"kept-{uuid.uuid4()}"
        # The filler must share the thread's partition: only a record appended there
        # rolls the segment holding the thread's last records so the cleaner may take it.
        filler = next(f for f in (f"filler-{uuid.uuid4()}" for _ in range(10_000))
                      if partition_for(f, settings.partitions)
                      == partition_for(thread, settings.partitions))
        for t in (thread, filler):
            send_command(producer, settings, CreateThread(t, "t", "x", _now()))
        turns = 50
        _turns(producer, settings, thread, [(f"q{i}", f"a{i}") for i in range(turns)])
        flush_all(producer)
        # Each question is written twice (accepted, then with its run's end): the
        # cleaner has run once only one record per key of the thread is left. New
        # records on the filler thread roll the segments the cleaner may compact.
        deadline = time.monotonic() + 240
        filler_turn = 0
        while True:
            mine = [k for k in keys_to_end(settings, settings.topics.messages)
                    if parse_message_key(k)[0] == thread]
            if len(mine) == 2 * turns:
                break
            assert time.monotonic() < deadline, f"no compaction: {len(mine)} records of the thread"
            _turns(producer, settings, filler, [("f", "f")], start=filler_turn)
            flush_all(producer)
            filler_turn += 1
            time.sleep(0.5)
        history = _history(settings, thread, 2 * turns)
        assert sorted(history) == list(range(2 * turns))
        assert [history[2 * i].message.text for i in range(turns)] == [f"q{i}" for i in range(turns)]
        assert all(history[2 * i].run_status is RunStatus.COMPLETED for i in range(turns))
    finally:
        proc.stop()
