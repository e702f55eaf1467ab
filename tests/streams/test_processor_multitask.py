"""Double-texting through the processor and Kafka alone: what each multitask
strategy writes (events, dispatches, lifecycle mirror, history and its tombstones)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Message

from streams.config import Settings
from streams.core.domain import (
    CreateThread,
    MultitaskStrategy,
    PostUserMessage,
    ReportAttemptCompleted,
    RunStatus,
)
from streams.core.history import message_key
from streams.core.ids import run_id_for
from streams.core.records import Dispatch, MessageRecord, RunLifecycle
from streams.testing.process import RoleProcess
from streams.wire import Codec
from tests.kafka_helpers import command_producer, read_messages, read_topic, send_command

CODEC = Codec()

pytestmark = pytest.mark.kafka


def _now() -> int:
    return int(time.time() * 1000)


def _dispatches(settings: Settings, thread: str, count: int) -> list[Dispatch]:
    found = read_topic(settings, settings.topics.dispatch, CODEC.decode_dispatch,
                       until=lambda r: sum(d.workflow_id.endswith(thread) for _, d in r) >= count)
    return [d for _, d in found if d.workflow_id.endswith(thread)]


_Rows = list[tuple[bytes, MessageRecord | None]]


def _history(settings: Settings, thread: str, until: Callable[[_Rows], bool]) -> _Rows:
    def decode(msg: Message) -> tuple[bytes, MessageRecord | None]:
        value = msg.value()
        return msg.key() or b"", None if value is None else CODEC.decode_message(value)[1]

    records = read_messages(settings, settings.topics.messages, decode,
                            until=lambda r: until([x for x in r if x[0].startswith(thread.encode())]))
    return [x for x in records if x[0].startswith(thread.encode())]


def _answer(thread: str, message_id: str, text: str) -> ReportAttemptCompleted:
    return ReportAttemptCompleted(thread, run_id_for(thread, message_id), 1, "w1", text, (), (),
                                  _now())


def test_enqueued_messages_run_in_order_each_seeing_the_answers_before_it(
        settings: Settings, processor: RoleProcess) -> None:
    """Two messages queued behind a run are dispatched one after the other, in order, each
    with the answers stored while it waited as context and without the messages behind it."""
    producer = command_producer(settings)
    thread = f"th-{uuid.uuid4()}"
    enqueue = MultitaskStrategy.ENQUEUE
    send_command(producer, settings, CreateThread(thread, "t", "q", _now()))
    send_command(producer, settings, PostUserMessage(thread, "t", "m1", "first", None, _now()))
    send_command(producer, settings, PostUserMessage(thread, "t", "m2", "second", None, _now(),
                                                     enqueue))
    send_command(producer, settings, PostUserMessage(thread, "t", "m3", "third", None, _now(),
                                                     enqueue))
    producer.flush(10)
    assert [d.message_id for d in _dispatches(settings, thread, 1)] == ["m1"], processor.tail()
    send_command(producer, settings, _answer(thread, "m1", "answer one"))
    producer.flush(10)
    second = _dispatches(settings, thread, 2)[1]
    assert (second.message_id, second.input_text) == ("m2", "second")
    assert [m.text for m in second.history] == ["first", "answer one"]
    send_command(producer, settings, _answer(thread, "m2", "answer two"))
    producer.flush(10)
    third = _dispatches(settings, thread, 3)[2]
    assert (third.message_id, third.input_text) == ("m3", "third")
    # Its branch's path above it, in the order stored: "second" was stored before
    # "answer one" (it waited), so the context shows it so (branches.run_context_seqs).
    assert [m.text for m in third.history] == ["first", "second", "answer one", "answer two"]


@pytest.mark.parametrize("strategy", [MultitaskStrategy.INTERRUPT, MultitaskStrategy.ROLLBACK])
def test_interrupt_and_rollback_cancel_the_run_then_start_the_new_one(
        settings: Settings, processor: RoleProcess, strategy: MultitaskStrategy) -> None:
    """The lifecycle shows run_cancelled (why, as its detail) before the new run_accepted;
    an interrupted message stays in the history, cancelled; a rolled-back one is tombstoned
    and left out of the new run's context."""
    producer = command_producer(settings)
    thread = f"th-{uuid.uuid4()}"
    send_command(producer, settings, CreateThread(thread, "t", "q", _now()))
    send_command(producer, settings, PostUserMessage(thread, "t", "m0", "earlier", None, _now()))
    send_command(producer, settings, _answer(thread, "m0", "answer zero"))
    send_command(producer, settings, PostUserMessage(thread, "t", "m1", "first", None, _now()))
    send_command(producer, settings, PostUserMessage(thread, "t", "m2", "second", None, _now(),
                                                     strategy))
    producer.flush(10)
    new = _dispatches(settings, thread, 3)[2]
    assert new.message_id == "m2", processor.tail()
    rolled_back = strategy is MultitaskStrategy.ROLLBACK
    expected = ["earlier", "answer zero"] + ([] if rolled_back else ["first"])
    assert [m.text for m in new.history] == expected

    lifecycle = [(o.run_id, o.payload.event, o.payload.detail) for _, o in read_topic(
        settings, settings.topics.stream, CODEC.decode_stream,
        until=lambda r: sum(o.run_id == run_id_for(thread, "m2") for _, o in r) >= 2)
        if isinstance(o.payload, RunLifecycle) and o.run_id in
        (run_id_for(thread, "m1"), run_id_for(thread, "m2"))]
    cancelled = lifecycle.index((run_id_for(thread, "m1"), "run_cancelled",
                                 "rolled_back" if rolled_back else "interrupted"))
    assert cancelled < lifecycle.index((run_id_for(thread, "m2"), "run_accepted", ""))

    first_key = message_key(thread, 2)  # m0, its answer, then m1
    if rolled_back:
        history = _history(settings, thread, lambda r: any(k == first_key and v is None
                                                           for k, v in r))
        assert any(k == first_key and v is None for k, v in history)
    else:
        history = _history(settings, thread, lambda r: any(
            k == first_key and v is not None and v.run_status is RunStatus.CANCELLED for k, v in r))
        assert all(v is not None for k, v in history if k == first_key)
