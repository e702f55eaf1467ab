"""The feed against scripted records: a test producer writes thread states and stream
records exactly as the processor and worker would, in an order no healthy worker
makes on demand (zombie executions, output after the end), and trims the topic."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from gateway.app import Options, create_app
from gateway.kafka import partition_for
from streams.config import Settings
from streams.core.domain import (
    ActiveRun,
    AssistantMessage,
    CreateThread,
    PostUserMessage,
    RunRecord,
    RunStatus,
    StoredMessage,
    ThreadState,
)
from streams.core.history import message_key
from streams.core.ids import answer_message_id_for, idempotent_message_id_for, run_id_for
from streams.core.records import (
    MessageEnd,
    MessageRecord,
    MessageStart,
    RunLifecycle,
    StreamOutput,
    TextDelta,
)
from streams.kafka.topics import ensure_topics
from streams.testing.sse import SseEvent as Ev
from streams.testing.sse import read_sse, until_opened
from streams.wire import Codec, new_meta
from tests.gateway.conftest import AUTH_A, Stack, gateway_env
from tests.gateway.sse_client import check_every_resume
from tests.kafka_helpers import read_topic

CODEC = Codec()  # single-object records, as the roles write them without a registry

pytestmark = pytest.mark.kafka

TENANT = "tenant-a"


class Script:
    """Writes what the processor and a worker would write, for one thread."""

    def __init__(self, settings: Settings, producer: Producer, thread_id: str) -> None:
        self.settings, self.producer, self.thread_id = settings, producer, thread_id
        self.created = int(time.time() * 1000)

    def state(self, run_id: str, status: RunStatus, answer: str | None = None) -> None:
        """The thread with one run (the user message at seq 0, its answer at 1)."""
        user = StoredMessage(f"user-{run_id}", "user", "hi", run_id, self.created)
        messages = [MessageRecord(0, user, status, 1)]
        if answer is not None:
            messages.append(MessageRecord(1, StoredMessage(
                answer_message_id_for(run_id), "assistant", answer, run_id, self.created)))
        active = None if status.is_terminal else ActiveRun(
            run_id, user.message_id, 1, status, self.created, self.created, None,
            message_seq=0, accepted_at_ms=self.created)
        last = RunRecord(run_id, user.message_id, status, 1) if status.is_terminal else None
        state = ThreadState(self.thread_id, TENANT, "scripted", self.created, active_run=active,
                            message_count=len(messages), run_count=1, last_run=last,
                            updated_at_ms=self.created)
        meta = new_meta(self.thread_id, TENANT, self.created)
        for record in messages:
            self.producer.produce(self.settings.topics.messages, CODEC.encode_message(record, meta),
                                  message_key(self.thread_id, record.seq),
                                  partition=partition_for(self.thread_id,
                                                          self.settings.partitions))
        self.producer.produce(self.settings.topics.threads, CODEC.encode_state(state),
                              self.thread_id.encode())
        self.producer.flush(10)

    def out(self, run_id: str, attempt: int, part: str, seq: int, payload: object) -> None:
        """Write one stream output of a run, as a worker would."""
        output = StreamOutput(run_id, attempt, answer_message_id_for(run_id), part, seq,
                              payload)  # type: ignore[arg-type]
        meta = new_meta(self.thread_id, TENANT, int(time.time() * 1000))
        self.producer.produce(self.settings.topics.stream, CODEC.encode_stream(output, meta),
                              self.thread_id.encode())

    def life(self, run_id: str, event: str, attempt: int = 0, text: str = "") -> None:
        """Write one lifecycle record of a run, as the processor would."""
        message = AssistantMessage(answer_message_id_for(run_id), text) if text else None
        self.out(run_id, attempt, "lifecycle", 0,
                 RunLifecycle(event, f"user-{run_id}", "", message))

    def plain_run(self, run_id: str, words: list[str]) -> None:
        """Write a whole run: accepted, dispatched, its words as deltas, completed."""
        self.life(run_id, "run_accepted")
        self.life(run_id, "attempt_dispatched", 1)
        self.out(run_id, 1, "e:message", 0, MessageStart("assistant"))
        for seq, word in enumerate(words, 1):
            self.out(run_id, 1, "e:text:0", seq, TextDelta(word))
        self.life(run_id, "run_completed", 1, "".join(words))
        self.producer.flush(10)


@pytest.fixture(scope="module")
def scripted(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> \
        Iterator[tuple[Settings, Producer]]:
    """Settings and a producer for scripting stream records by hand, for this module."""
    settings = Settings.from_env(gateway_env(kafka_bootstrap, tmp_path_factory.mktemp("s")))
    ensure_topics(settings)
    producer = Producer({"bootstrap.servers": settings.bootstrap,
                         "partitioner": "murmur2_random", "enable.idempotence": True})
    yield settings, producer
    producer.flush(10)


@asynccontextmanager
async def _gateway(settings: Settings) -> AsyncIterator[str]:
    """A gateway on the scripted topics: no processor or worker answers there."""
    server = TestServer(create_app(settings, Options(keepalive_s=1)), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url(""))
    finally:
        await server.close()


def _texts(events: list[Ev]) -> list[str]:
    return [e.json["delta"] for e in events if e.event == "text_delta"]


async def test_superseded_executions_never_reach_clients(
        stack: Stack, scripted: tuple[Settings, Producer]) -> None:
    """Output of an execution that was superseded by a rerun never reaches clients."""
    settings, producer = scripted
    script = Script(settings, producer, f"th-{uuid.uuid4()}")
    run = f"run-{uuid.uuid4()}"
    script.state(run, RunStatus.DISPATCHED)
    async with _gateway(settings) as base:
        opened = asyncio.Event()
        live_task = asyncio.create_task(read_sse(
            stack.session, f"{base}/v1/threads/{script.thread_id}/stream", headers=AUTH_A,
            opened=opened))
        await until_opened(opened, live_task)
        script.life(run, "run_accepted")
        script.life(run, "attempt_dispatched", 1)
        script.out(run, 1, "A:message", 0, MessageStart("assistant"))
        script.out(run, 1, "A:text:0", 1, TextDelta("a1 "))
        script.out(run, 1, "B:message", 0, MessageStart("assistant"))  # attempt 1 runs again
        script.out(run, 1, "A:text:0", 2, TextDelta("ZOMBIE-A "))
        script.out(run, 1, "B:text:0", 1, TextDelta("b1 "))
        script.life(run, "retry_scheduled", 1)
        script.out(run, 1, "B:text:0", 2, TextDelta("ZOMBIE-B "))
        script.life(run, "attempt_dispatched", 2)
        script.out(run, 2, "C:message", 0, MessageStart("assistant"))
        script.out(run, 2, "C:text:0", 1, TextDelta("c1"))
        script.out(run, 1, "A:text:0", 3, TextDelta("ZOMBIE-A "))
        script.out(run, 2, "C:message", 2, MessageEnd("stop"))
        script.life(run, "run_completed", 2, "c1")
        script.out(run, 2, "C:text:0", 3, TextDelta("ZOMBIE-C"))
        producer.flush(10)
        live = await live_task
        assert [e.event for e in live] == [
            "run_accepted", "attempt_dispatched", "message_start", "text_delta",
            "message_start", "text_delta", "retry_scheduled", "attempt_dispatched",
            "message_start", "text_delta", "message_end", "run_completed", "done"]
        assert _texts(live) == ["a1 ", "b1 ", "c1"]
        assert [e.json["attempt"] for e in live if e.event == "message_start"] == [1, 1, 2]
        script.state(run, RunStatus.COMPLETED, "c1")
        await check_every_resume(stack.session, base, live, script.thread_id, run)
    async with _gateway(settings) as cold:  # replays from Kafka filter the same way
        await check_every_resume(stack.session, cold, live, script.thread_id, run)


async def test_positions_older_than_the_log_start_get_message_not_streaming(
        stack: Stack, scripted: tuple[Settings, Producer], tmp_path: Path) -> None:
    """Resuming from a position whose records retention removed gets message_not_streaming."""
    settings, producer = scripted
    script = Script(settings, producer, f"th-{uuid.uuid4()}")
    first, second = f"run-{uuid.uuid4()}", f"run-{uuid.uuid4()}"
    script.state(first, RunStatus.DISPATCHED)
    script.plain_run(first, ["old ", "words"])
    script.state(first, RunStatus.COMPLETED, "old words")
    async with _gateway(settings) as base:
        before = await read_sse(stack.session, f"{base}/v1/runs/{first}/events", headers=AUTH_A)
    assert _texts(before) == ["old ", "words"]
    # Retention removes the run's records from the topic.
    partition = partition_for(script.thread_id, settings.partitions)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    futures = admin.delete_records([TopicPartition(settings.topics.stream, partition, -1)])
    for future in futures.values():
        future.result(10)
    async with _gateway(settings) as cold:
        gone = await read_sse(stack.session, f"{cold}/v1/runs/{first}/events", headers=AUTH_A,
                              until=lambda _: False)
        assert [e.event for e in gone] == ["message_not_streaming"]
        assert gone[0].id is None
        assert gone[0].json["message_id"] == answer_message_id_for(first)
        # A thread stream says so too, then goes on live.
        opened = asyncio.Event()
        resumed_task = asyncio.create_task(read_sse(
            stack.session, f"{cold}/v1/threads/{script.thread_id}/stream",
            headers={**AUTH_A, "Last-Event-ID": before[3].id or ""},
            until=lambda e: e[-1].event == "done", opened=opened))
        await until_opened(opened, resumed_task)  # open before the next run (no sleep)
        script.plain_run(second, ["new"])
        resumed = await resumed_task
        assert resumed[0].event == "message_not_streaming"
        assert resumed[0].json["run_id"] == first
        assert [e.event for e in resumed[1:]][:2] == ["run_accepted", "attempt_dispatched"]
        assert _texts(resumed) == ["new"] and {e.json["run_id"] for e in resumed[1:-1]} == {second}


async def test_without_a_decision_in_time_the_answer_is_202_pending_and_the_command_queued(
        stack: Stack, scripted: tuple[Settings, Producer]) -> None:
    """A post with no decision within the timeout gets 202 pending, and the command is still decided."""
    settings, producer = scripted
    settings = settings.with_(gateway=replace(settings.gateway, decision_timeout_ms=300))
    script = Script(settings, producer, f"th-{uuid.uuid4()}")
    script.state(f"run-{uuid.uuid4()}", RunStatus.COMPLETED, "done before")
    async with _gateway(settings) as base:
        url = f"{base}/v1/threads/{script.thread_id}/user_message"
        headers = {**AUTH_A, "Idempotency-Key": "pending-1"}
        async with stack.session.post(url, json={"input_text": "anyone?"},
                                      headers=headers) as response:
            body = await response.json()
            assert response.status == 202, body
        message_id = idempotent_message_id_for(TENANT, script.thread_id, "pending-1")
        assert body == {"workflow_id": f"agent-{script.thread_id}", "message_id": message_id,
                        "run_id": run_id_for(script.thread_id, message_id),
                        "status": "pending"}
        async with stack.session.post(f"{base}/v1/threads", json={"title": "x"},
                                      headers=AUTH_A) as response:
            created = await response.json()
            assert response.status == 202 and created["status"] == "pending", created
    commands = read_topic(settings, settings.topics.commands, lambda b: CODEC.decode_command(b)[1],
                          until=lambda r: len(r) >= 2, timeout=20)
    posted = [c for c in commands if isinstance(c, PostUserMessage)]
    assert [(c.thread_id, c.message_id, c.text, c.idempotency_key) for c in posted] == [
        (script.thread_id, message_id, "anyone?", "pending-1")]
    assert [c.thread_id for c in commands if isinstance(c, CreateThread)] == \
        [created["thread_id"]]
