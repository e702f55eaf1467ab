"""States written by release 0.1 (the whole history inline) are migrated in place by
the processor: every message becomes its own record, exactly once, even when the
processor is killed mid-migration and a new one carries on."""

from __future__ import annotations

import io
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer

from streams.config import Settings
from streams.core.domain import (
    ActiveRun,
    IdempotencyRecord,
    PostUserMessage,
    RejectReason,
    RunAccepted,
    RunRecord,
    RunRejected,
    RunStatus,
    StoredMessage,
    ThreadState,
)
from streams.core.history import parse_message_key
from streams.core.ids import answer_message_id_for, run_id_for
from streams.core.records import MessageRecord
from streams.kafka.topics import ensure_topics
from streams.migration import migrated
from streams.testing.process import RoleProcess
from streams.wire import SCHEMA_DIR, Codec, schema_fingerprint
from tests.kafka_helpers import (
    command_producer,
    flush_all,
    keys_to_end,
    read_topic,
    send_command,
)

CODEC = Codec()  # single-object records, as the roles write them without a registry

THREADS = 1_200
TURNS = 2  # each old thread: two answered turns, so four messages


def test_migrated_splits_the_history_and_bounds_the_state() -> None:
    """Migration turns an old state's embedded history into message records and a bounded state."""
    messages = (
        StoredMessage("m1", "user", "Hi", "r1", 2),
        StoredMessage("a1", "assistant", "Hello", "r1", 3),
        StoredMessage("m2", "user", "And?", "r2", 4),
    )
    runs = {"r1": RunRecord("r1", "m1", RunStatus.COMPLETED, 1),
            "r2": RunRecord("r2", "m2", RunStatus.RUNNING, 2)}
    old = ThreadState("t", "acme", "title", 1,
                      active_run=ActiveRun("r2", "m2", 2, RunStatus.RUNNING, 5, 6, None),
                      idempotency={"k": IdempotencyRecord("m1", "r1", "fp")})
    state, records = migrated(old, messages, runs, now_ms=99)
    assert records == [MessageRecord(0, messages[0], RunStatus.COMPLETED, 1),
                       MessageRecord(1, messages[1]),
                       MessageRecord(2, messages[2], RunStatus.RUNNING, 2)]
    assert (state.message_count, state.run_count, state.updated_at_ms) == (3, 2, 4)
    assert state.last_run == runs["r1"]
    assert state.active_run is not None
    assert (state.active_run.message_seq, state.active_run.accepted_at_ms) == (2, 4)
    assert state.idempotency["k"].at_ms == 99  # the key-to-body check runs a full window


def _v1_writer() -> tuple[Any, bytes]:
    path = next((SCHEMA_DIR / "history").glob("threadline.ThreadState-*.avsc"))
    parsed = fastavro.parse_schema(json.loads(path.read_text()))
    return parsed, b"\xc3\x01" + schema_fingerprint(parsed)


def _old_state(thread_id: str) -> dict[str, Any]:
    messages, runs = [], {}
    for turn in range(TURNS):
        message_id = f"m{turn}"
        run_id = run_id_for(thread_id, message_id)
        messages += [
            {"message_id": message_id, "role": "user", "text": f"question {turn}",
             "run_id": run_id, "created_at_ms": 10 + turn, "steps": [], "citations": []},
            {"message_id": answer_message_id_for(run_id), "role": "assistant",
             "text": f"answer {turn}", "run_id": run_id, "created_at_ms": 11 + turn,
             "steps": [], "citations": []},
        ]
        runs[run_id] = {"run_id": run_id, "message_id": message_id, "status": "completed",
                        "attempts": 1}
    return {"thread_id": thread_id, "tenant": "t", "title": "old", "created_at_ms": 1,
            "messages": messages, "active_run": None, "runs": runs,
            "run_by_message": {r["message_id"]: k for k, r in runs.items()}, "idempotency": {}}


def _committed_keys(settings: Settings) -> Counter[bytes]:
    """How many times each key is on the messages topic, as read_committed sees it."""
    return Counter(keys_to_end(settings, settings.topics.messages))


@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_a_processor_killed_mid_migration_leaves_each_message_stored_once(
    test_env: dict[str, str], tmp_path: Path
) -> None:
    """A processor killed during migration and restarted stores each old message exactly once."""
    env = {**test_env, "THREADLINE_MIGRATION_BATCH": "20"}
    settings = Settings.from_env(env)
    ensure_topics(settings)
    schema, header = _v1_writer()
    producer = Producer({"bootstrap.servers": settings.bootstrap, "partitioner": "murmur2_random",
                         "linger.ms": 20})
    threads = [f"old-{i}-{uuid.uuid4().hex[:6]}" for i in range(THREADS)]
    for thread_id in threads:
        out = bytearray(header)

        body = io.BytesIO()
        fastavro.schemaless_writer(body, schema, _old_state(thread_id))
        out += body.getvalue()
        producer.produce(settings.topics.threads, bytes(out), thread_id.encode())
    assert producer.flush(60) == 0

    first = RoleProcess("processor", env, tmp_path / "first.log").start()
    try:
        # Wait for a committed batch of the migration, then kill -9 in the middle of it.
        deadline = time.monotonic() + 120
        while "migrated 20 threads" not in first.tail(400):
            assert time.monotonic() < deadline, first.tail()
            assert first.alive(), first.tail()
            time.sleep(0.05)
        first.kill9()
    finally:
        first.stop()
    partial = sum(_committed_keys(settings).values())
    expected = THREADS * 2 * TURNS
    assert 0 < partial < expected, f"the kill did not land mid-migration ({partial} records)"

    second = RoleProcess("processor", env, tmp_path / "second.log").start()
    try:
        deadline = time.monotonic() + 300
        while sum(_committed_keys(settings).values()) < expected:
            assert time.monotonic() < deadline and second.alive(), second.tail()
            time.sleep(0.5)
        keys = _committed_keys(settings)
        assert len(keys) == expected and set(keys.values()) == {1}, "a record written twice"
        assert {parse_message_key(k)[0] for k in keys} == set(threads)

        # The migrated threads work: an old message id is a duplicate, a new one runs
        # with its history continuing at seq 4.
        commands = command_producer(settings)
        thread = threads[7]
        send_command(commands, settings, PostUserMessage(thread, "t", "m0", "question 0", None, 1))
        send_command(commands, settings, PostUserMessage(thread, "t", "m9", "next", None, 2))
        flush_all(commands)
        events = read_topic(settings, settings.topics.events, lambda b: CODEC.decode_event(b)[1],
                            until=lambda r: any(isinstance(e, RunAccepted) for e in r))
        assert [e.reason for e in events if isinstance(e, RunRejected)] == [RejectReason.DUPLICATE]
        records = read_topic(settings, settings.topics.messages, CODEC.decode_message,
                             until=lambda r: any(m.seq == 4 and meta.thread_id == thread
                                                 for meta, m in r))
        new = next(m for meta, m in records if meta.thread_id == thread and m.seq == 4)
        assert (new.message.message_id, new.message.text) == ("m9", "next")
    finally:
        second.stop()
