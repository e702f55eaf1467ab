"""Thread copies through the processor and Kafka (issue #30, docs/branches.md): the
source's processor writes the parts to the copy's partition in the transaction that
decides the copy, and the copy's history is the source's, every branch and seq; with
the processor dying before each commit on the way, still exactly once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Message

from gateway.kafka import partition_for
from streams.config import Settings
from streams.core.domain import (
    CopyThread,
    EditMessage,
    Event,
    HistoryImported,
    MessageAccepted,
    RejectReason,
    RunRejected,
    SwitchBranch,
    ThreadCopied,
    ThreadCreated,
)
from streams.core.ids import regenerate_run_id_for, run_id_for
from streams.core.records import MessageRecord
from streams.kafka.faults import FAULT_ENV, FAULT_EXIT_STATUS, arm
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess
from streams.wire import REPLY_HEADER, Codec, header_value, new_meta, payload_named
from tests.kafka_helpers import command_producer, read_messages
from tests.streams.test_processor_branches import Thread, _now, _texts

CODEC = Codec()

pytestmark = pytest.mark.kafka

BIG = 300_000  # two answers this long cannot share a part (half the record limit)


def _copy_id(settings: Settings, source: str) -> str:
    """A new thread id on another partition than `source`'s: the parts cross partitions."""
    while True:
        candidate = f"copy-{uuid.uuid4()}"
        if partition_for(candidate, settings.partitions) != partition_for(source, settings.partitions):
            return candidate


def _branched(settings: Settings) -> Thread:
    """m0 answered; m1 answered; m1 edited and answered (BIG), that answer regenerated
    (BIG); back on m1's branch: seqs 0-6, three branches, the current one ending at 3."""
    source = Thread(settings, command_producer(settings))
    source.post("m0", "first")
    source.answer(run_id_for(source.id, "m0"), "answer zero")
    source.post("m1", "second")
    source.answer(run_id_for(source.id, "m1"), "answer one")
    source.send(EditMessage(source.id, "t", "m1", "m1-e", "second, edited", None, _now()))
    source.answer(run_id_for(source.id, "m1-e"), "e" * BIG)
    source.regenerate("m1-e", "k")
    source.answer(regenerate_run_id_for(source.id, "k"), "r" * BIG)
    source.send(SwitchBranch(source.id, "t", 3, _now()))
    return source


def _complete(copy: Thread) -> list[Event]:
    """The copy's events once its last part is in."""
    return copy.events(until=lambda events: any(
        isinstance(e, HistoryImported) and e.last for e in events))


def _same_history(source: dict[int, MessageRecord | None],
                  copy: dict[int, MessageRecord | None]) -> None:
    assert sorted(copy) == sorted(source) == list(range(7))
    for seq, record in source.items():
        assert record is not None
        assert copy[seq] == record, seq  # message, run status, parent: all as they were


def test_a_copy_holds_every_branch_at_its_seqs_and_goes_on_by_itself(
        settings: Settings, processor: RoleProcess) -> None:
    """A copy of a branched thread holds every branch at the source's seqs, in parts
    written across partitions; it answers on the branch that was current, and what
    happens on it stays off the source."""
    source = _branched(settings)
    copy = Thread(settings, source.producer, _copy_id(settings, source.id))
    source.send(CopyThread(source.id, "t", copy.id, "the copy", _now()))

    events = _complete(copy)
    parts = [e for e in events if isinstance(e, HistoryImported)]
    assert [type(e) for e in events][:1] == [ThreadCreated]
    assert [(p.part, p.parts) for p in parts] == [(i, len(parts)) for i in range(len(parts))]
    assert len(parts) >= 2 and sum(p.count for p in parts) == 7
    copied = [e for e in source.events() if isinstance(e, ThreadCopied)]
    assert [(c.target_thread_id, c.message_count, c.parts) for c in copied] == \
        [(copy.id, 7, len(parts))]
    before = source.history()
    _same_history(before, copy.history())

    copy.post("m2", "third")  # on the copy's current branch: the one switched back to
    dispatch = copy.dispatch_of(run_id_for(copy.id, "m2"))
    assert (dispatch.input_text, _texts(dispatch)) == \
        ("third", ["first", "answer zero", "second", "answer one"])
    copy.answer(run_id_for(copy.id, "m2"), "answer two")
    history = copy.history()
    assert history[7] is not None and history[7].parent_seq == 3
    assert source.history() == before  # nothing of the copy's went to the source

    again = copy.id  # a copy into a thread that exists now is refused at its first part
    source.send(CopyThread(source.id, "t", again, "again", _now()))
    assert len([e for e in copy.events() if isinstance(e, ThreadCreated)]) == 1


def test_the_reply_header_of_a_copy_comes_back_on_the_events_of_both_threads(
        settings: Settings, processor: RoleProcess) -> None:
    """A command's REPLY_HEADER comes back on every event decided from it, and through
    the copy's parts on the copy's events; each event names its payload type."""
    source = Thread(settings, command_producer(settings))
    source.post("m0", "first")
    copy_id = _copy_id(settings, source.id)
    command = CopyThread(source.id, "t", copy_id, "the copy", _now())
    source.producer.produce(settings.topics.commands, CODEC.encode_command(
        command, new_meta(source.id, "t", _now())), source.id.encode(),
        headers=[(REPLY_HEADER, b"gateway-42")])
    source.producer.flush(30)

    def decoded(msg: Message) -> tuple[Event, bytes | None, bytes | None]:
        event = CODEC.decode_event(msg.value() or b"")[1]
        return event, header_value(msg.headers(), REPLY_HEADER), payload_named(msg.headers())

    def both_sides(found: list[tuple[Event, bytes | None, bytes | None]]) -> bool:
        return any(isinstance(e, HistoryImported) and e.thread_id == copy_id and e.last
                   for e, _, _ in found) and \
            any(isinstance(e, ThreadCopied) and e.target_thread_id == copy_id for e, _, _ in found)

    events = read_messages(settings, settings.topics.events, decoded, until=both_sides)
    on_copy = [(type(e), reply, kind) for e, reply, kind in events if e.thread_id == copy_id]
    assert on_copy == [(ThreadCreated, b"gateway-42", b"ThreadCreated"),
                       (HistoryImported, b"gateway-42", b"HistoryImported")]
    copied = [(reply, kind) for e, reply, kind in events if isinstance(e, ThreadCopied)
              and e.target_thread_id == copy_id]
    assert copied == [(b"gateway-42", b"ThreadCopied")]  # on the source's partition
    posted = [(reply, kind) for e, reply, kind in events
              if e.thread_id == source.id and isinstance(e, MessageAccepted)]
    assert posted == [(None, b"MessageAccepted")]  # sent without the header


def test_a_copy_of_an_unknown_thread_is_refused(settings: Settings, processor: RoleProcess) -> None:
    """A copy of a thread that does not exist (for this tenant) is refused: unknown thread."""
    source = Thread(settings, command_producer(settings))
    source.send(CopyThread(source.id, "another tenant", f"copy-{uuid.uuid4()}", "", _now()))
    refused = [e for e in source.events()
               if isinstance(e, RunRejected) and e.message_id.startswith("copy-")]
    assert [e.reason for e in refused] == [RejectReason.UNKNOWN_THREAD]


def test_a_copy_with_the_processor_dying_before_each_commit_happens_once(
        test_env: dict[str, str], tmp_path: Path) -> None:
    """The processor exits at its fault point (records on the broker, transaction not
    committed) in the step that writes the parts and again in a step of the copy's:
    each aborted step is done again, and the copy is made once, whole."""
    settings = Settings.from_env(test_env)
    ensure_topics(settings)
    trigger = tmp_path / "fault-trigger"
    proc = RoleProcess("processor", {**test_env, FAULT_ENV: str(trigger)},
                       tmp_path / "p.log").start()
    try:
        source = _branched(settings)
        copy = Thread(settings, source.producer, _copy_id(settings, source.id))
        for _ in range(2):  # the source's step, then (at the latest) the copy's first
            arm(trigger, copy.id)
            if _ == 0:
                source.send(CopyThread(source.id, "t", copy.id, "the copy", _now()))
            assert proc.wait(timeout=3600) == FAULT_EXIT_STATUS, proc.tail()
            proc.start()

        events = _complete(copy)
        assert len([e for e in events if isinstance(e, ThreadCreated)]) == 1
        parts = [(e.part, e.parts) for e in events if isinstance(e, HistoryImported)]
        assert parts == [(i, len(parts)) for i in range(len(parts))]  # each once, in order
        assert len([e for e in source.events() if isinstance(e, ThreadCopied)]) == 1
        _same_history(source.history(), copy.history())
    finally:
        proc.stop()
