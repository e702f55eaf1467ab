"""The wire contract: round trips, schema/dataclass drift, other readers, bad bytes."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, is_dataclass, replace
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType
from typing import Any, get_args, get_origin, get_type_hints

import avro.io
import avro.name
import avro.schema
import fastavro
import pytest
from confluent_kafka.schema_registry import Schema as RegistrySchema
from confluent_kafka.schema_registry import SchemaRegistryClient
from fastavro.schema import load_schema
from hypothesis import example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from streams.config import Settings, TopicNames
from streams.core import ids, records
from streams.core.domain import (
    ActiveRun,
    AssistantMessage,
    AttemptDispatched,
    AttemptStarted,
    BranchSwitched,
    CancelRun,
    CheckDeadlines,
    Citation,
    Command,
    CopiedMessage,
    CopyThread,
    CreateThread,
    DeleteThread,
    EditMessage,
    Event,
    ExecutionStarted,
    HeartbeatRecorded,
    HistoryImported,
    IdempotencyRecord,
    ImportHistory,
    MessageAccepted,
    MessageQueued,
    MultitaskStrategy,
    PartialAnswerStored,
    PostUserMessage,
    QueuedMessage,
    RegenerateAccepted,
    RegenerateAnswer,
    RejectReason,
    ReportAttemptCompleted,
    ReportAttemptFailed,
    ReportAttemptStarted,
    ReportExecutionStarted,
    ReportHeartbeat,
    ReportStepCompleted,
    ResumeRun,
    RetryScheduled,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunInterrupted,
    RunRecord,
    RunRejected,
    RunStatus,
    Step,
    StepRecorded,
    StoredMessage,
    SwitchBranch,
    ThreadCopied,
    ThreadCreated,
    ThreadDeleted,
    ThreadState,
)
from streams.core.journal import JournalEntry
from streams.core.records import (
    CitationsOutput,
    DeadLetter,
    Dispatch,
    HistoryMessage,
    MessageEnd,
    MessageRecord,
    MessageStart,
    RunLifecycle,
    StepOutput,
    StreamOutput,
    StreamPart,
    TextDelta,
    TextEnd,
    TextStart,
)
from streams.wire import (
    SCHEMA_DIR,
    TOP_LEVEL_SCHEMAS,
    Codec,
    ConfluentRegistry,
    DecodeError,
    EnvelopeMeta,
    RegistryError,
    new_meta,
    schema_fingerprint,
    schema_registry,
)
from streams.wire.codec import KEYS_KEPT, KEYS_KEPT_FROM
from streams.wire.envelope import random_uuid, uuid4_text

CODEC = Codec()  # single-object records, as the roles write them without a registry

T = "thread-1"
STEPS = (Step("tool_call", "search", '{"q": "kafka"}'), Step("tool_result", "search", "[]"))
CITES = (Citation("https://kafka.apache.org", "Kafka"), Citation("https://avro.apache.org", "Avro"))

ENTRY = JournalEntry(3, "tool_call", "lookup", '{"q": "✈️"}', '{"content": 1}', "exec-1")
COMMANDS: list[Command] = [
    CreateThread(T, "acme", "Trip planning", 1_700_000_000_000),
    PostUserMessage(T, "acme", "m1", "Hello ✈️ — été", "idem-1", 1),
    PostUserMessage(T, "acme", "m2", "", None, 2),
    *(PostUserMessage(T, "acme", "m3", "again", None, 3, strategy)
      for strategy in MultitaskStrategy),
    CancelRun(T, "acme", "r1", "user asked", 3),
    ReportAttemptStarted(T, "r1", 1, "worker-a", 4),
    ReportHeartbeat(T, "r1", 1, "worker-a", 5),
    ReportAttemptCompleted(T, "r1", 2, "worker-b", "Done.", STEPS, CITES, 6),
    ReportAttemptCompleted(T, "r1", 2, "worker-b", "Done.", (), (), 6),
    ReportAttemptFailed(T, "r1", 1, "worker-a", "model timeout", True, 7),
    ReportAttemptFailed(T, "r1", 2, "worker-a", "bad request", False, 8),
    CheckDeadlines(T, 2**62),
    DeleteThread(T, "acme", 9),
    ReportStepCompleted(T, "r1", 1, "worker-a", ENTRY, 10),
    ResumeRun(T, "acme", "r1", '{"ok": true}', 11),
    ReportExecutionStarted(T, "r1", 1, "worker-a", "exec-1", 12),
    *(RegenerateAnswer(T, "acme", "m1", "regen-1", 13, strategy) for strategy in MultitaskStrategy),
    EditMessage(T, "acme", "m1", "m1-edit", "Hello again ✈️", "edit-1", 14),
    EditMessage(T, "acme", "m1", "m1-edit", "Hello", None, 14, MultitaskStrategy.ROLLBACK),
    SwitchBranch(T, "acme", 2**40, 15),
    CopyThread(T, "acme", "copy-1", "Trip planning (copy)", 16),
    ImportHistory(T, "acme", "source-1", "Trip planning (copy)", 1, 3, (
        CopiedMessage(4, StoredMessage("m1", "user", "Hello ✈️", "r1", 1), RunStatus.COMPLETED, 1),
        CopiedMessage(7, StoredMessage("m-a1", "assistant", "Done.", "r1", 2, STEPS, CITES),
                      None, 0, 4)), 2**40, -1, (2, 3), 17),
    ImportHistory(T, "acme", "source-1", "", 0, 1, (), 0, -2, (), 17),
]
EVENTS: list[Event] = [
    ThreadCreated(T, "acme", "Trip planning", 1),
    MessageAccepted(T, "m1", "Hello", "idem-1", 2),
    MessageAccepted(T, "m2", "Hello", None, 2),
    MessageQueued(T, "m2", 3, 2),
    MessageAccepted(T, "m2-edit", "Hello", None, 2, parent_seq=-1),
    MessageAccepted(T, "m2-edit", "Hello", "idem-2", 2, parent_seq=2**40),
    MessageQueued(T, "m1", 0, 2, seq=0, run_id="r-regen", branch=True),
    RunAccepted(T, "r1", ids.workflow_id_for(T), "m1", 3),
    *(RunRejected(T, "m3", reason, "because", None, 4) for reason in RejectReason),
    RunRejected(T, "m1", RejectReason.DUPLICATE, "already ran", "r1", 4),
    AttemptDispatched(T, "r1", "m1", 1, 5),
    AttemptStarted(T, "r1", 1, "worker-a", 6),
    HeartbeatRecorded(T, "r1", 1, 7),
    RetryScheduled(T, "r1", 1, 2, 9_000, "heartbeat_timeout", 8),
    RunCompleted(T, "r1", 2, AssistantMessage("m-a1", "Done.", STEPS, CITES), 9),
    RunCompleted(T, "r1", 1, AssistantMessage("m-a1", "Done."), 9),
    PartialAnswerStored(T, "r1", 1, AssistantMessage("m-a1", "Do", STEPS, CITES), 9),
    RunFailed(T, "r1", 2, "gave up", -1),
    RunCancelled(T, "r1", "user asked", 11),
    ThreadDeleted(T, "acme", 12, 13),
    StepRecorded(T, "r1", 2, ENTRY, 14),
    RunInterrupted(T, "r1", 2, 4, '{"question": "?"}', 15),
    ExecutionStarted(T, "r1", 2, "exec-2", 16),
    RegenerateAccepted(T, "m1", 0, "r-regen", "regen-1", 17),
    BranchSwitched(T, 2**40, 18),
    ThreadCopied(T, "copy-1", 2**40, 3, 19),
    HistoryImported(T, "source-1", 1, 3, 500, 2**40, -1, (2, 3), 20),
]
PARTS: list[StreamPart] = [
    MessageStart("assistant"),
    TextStart(),
    TextDelta("Hel"),
    TextEnd("Hello"),
    StepOutput("tool_call", "search", "{}"),
    CitationsOutput(CITES),
    CitationsOutput(()),
    MessageEnd("stop"),
    RunLifecycle("run_accepted", "m1", ""),
    RunLifecycle("run_completed", "m1", "", AssistantMessage("a1", "Hello", (), CITES)),
]
MESSAGES = [
    MessageRecord(0, StoredMessage("m1", "user", "Hi ✈️", "r1", 2), RunStatus.COMPLETED, 2),
    MessageRecord(1, StoredMessage("m-a1", "assistant", "Hello", "r1", 3, STEPS, CITES)),
    MessageRecord(2**40, StoredMessage("m2", "user", "", "r2", 4), RunStatus.DISPATCHED),
    MessageRecord(5, StoredMessage("m3", "user", "Edited", "r3", 5), RunStatus.DISPATCHED, 0, -1),
    MessageRecord(6, StoredMessage("m-a3", "assistant", "Again", "r4", 6), None, 0, 2),
]
DISPATCH = Dispatch(
    "r1", "m3", 2, "agent-thread-1", "And tomorrow?",
    (HistoryMessage("m1", "user", "Hi"), HistoryMessage("m-a1", "assistant", "Hello")), 10,
)
DISPATCH_WITH_JOURNAL = replace(DISPATCH, journal=(ENTRY,))
DEAD_LETTERS = [
    DeadLetter("threadline.commands", 3, 2**40, b"thread-1", b"\x00\xff", "bad", "DecodeError", 1),
    DeadLetter("threadline.commands", 0, 0, None, b"", "empty", "DecodeError", 2),
]
STATES = [
    ThreadState(T, "acme", "Trip planning", 1),
    ThreadState(
        T, "acme", "Trip planning", 1,
        active_run=ActiveRun("r2", "m2", 2, RunStatus.RETRY_WAIT, 4, 5, None, 2, 4, (ENTRY,),
                             '{"question": "?"}'),
        idempotency=MappingProxyType({"idem-1": IdempotencyRecord("m1", "r1", "sha256:ab", 2)}),
        message_count=3, run_count=2, last_run=RunRecord("r1", "m1", RunStatus.COMPLETED, 1),
        updated_at_ms=5, queued=(QueuedMessage("m3", 3, 5), QueuedMessage("m4", 4, 6)),
        rolled_back=("m0",), interrupted=RunRecord("r0", "m0", RunStatus.CANCELLED, 2),
    ),
    ThreadState(
        T, "acme", "Branched", 1, message_count=9,
        queued=(QueuedMessage("m1", 0, 5, "r-regen", True), QueuedMessage("m5", 8, 6, None, True)),
        head_seq=4, tip_seqs=(3, 2**40), interrupted_tip_seq=3,
    ),
    ThreadState(T, "acme", "Rolled back to nothing", 1, message_count=1, head_seq=-2),
    *(
        ThreadState(T, "acme", "", 1, active_run=ActiveRun("r", "m", 1, status, 1, 2, None))
        for status in RunStatus
    ),
]
META = EnvelopeMeta(
    "0b6f3c2e-8a9e-4a53-9d0c-3a4c7f1e2d10", T, "acme", 1_700_000_000_123,
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=opaque", 1,
)


def _all(union: Any) -> set[type]:
    return set(get_args(union))


def test_examples_cover_every_command_event_and_stream_part() -> None:
    """The examples include one of every command, event and stream part type."""
    assert {type(c) for c in COMMANDS} == _all(Command)
    assert {type(e) for e in EVENTS} == _all(Event)
    assert {type(p) for p in PARTS} == _all(StreamPart)


# --- round trips -------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: type(c).__name__)
def test_command_round_trip(command: Command) -> None:
    """Every command encodes and decodes back to itself with its envelope."""
    assert CODEC.decode_command(CODEC.encode_command(command, META)) == (META, command)


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_event_round_trip(event: Event) -> None:
    """Every event encodes and decodes back to itself with its envelope."""
    assert CODEC.decode_event(CODEC.encode_event(event, META)) == (META, event)


@pytest.mark.parametrize("part", PARTS, ids=lambda p: type(p).__name__)
def test_stream_round_trip(part: StreamPart) -> None:
    """Every stream part encodes and decodes back to itself with its envelope."""
    output = StreamOutput("r1", 1, "m-a1", "part-0", 0, part)
    assert CODEC.decode_stream(CODEC.encode_stream(output, META)) == (META, output)


@pytest.mark.parametrize("state", STATES)
def test_state_round_trip(state: ThreadState) -> None:
    """Thread states round-trip, stay read-only, and carry no legacy history."""
    decoded = CODEC.decode_state(CODEC.encode_state(state))
    assert decoded == state
    assert isinstance(decoded.idempotency, MappingProxyType)  # stays read-only
    assert CODEC.decode_legacy_history(CODEC.encode_state(state)) == ((), {})  # written empty


@pytest.mark.parametrize("record", MESSAGES, ids=lambda r: str(r.seq))
def test_message_record_round_trip(record: MessageRecord) -> None:
    """Message records round-trip with their envelope."""
    assert CODEC.decode_message(CODEC.encode_message(record, META)) == (META, record)


def test_a_state_in_the_old_form_still_reads_with_its_history() -> None:
    """A state written by release 0.1 (messages, runs and run_by_message inline):
    the bounded fields read as before, the history through CODEC.decode_legacy_history."""
    old = _STATES_SCHEMA_V1_RECORD
    data = _write_v1_state(old)
    state = CODEC.decode_state(data)
    assert (state.thread_id, state.tenant, state.title, state.message_count) == (T, "acme", "t", 0)
    messages, runs = CODEC.decode_legacy_history(data)
    assert [m.text for m in messages] == ["Hi", "Hello"]
    assert runs == {"r1": RunRecord("r1", "m1", RunStatus.COMPLETED, 1)}


_STATES_SCHEMA_V1_RECORD: dict[str, Any] = {
    "thread_id": T, "tenant": "acme", "title": "t", "created_at_ms": 1,
    "messages": [
        {"message_id": "m1", "role": "user", "text": "Hi", "run_id": "r1", "created_at_ms": 2,
         "steps": [], "citations": []},
        {"message_id": "a1", "role": "assistant", "text": "Hello", "run_id": "r1",
         "created_at_ms": 3, "steps": [], "citations": []},
    ],
    "active_run": None,
    "runs": {"r1": {"run_id": "r1", "message_id": "m1", "status": "completed", "attempts": 1}},
    "run_by_message": {"m1": "r1"},
    "idempotency": {},
}


def _write_v1_state(record: dict[str, Any]) -> bytes:
    """Bytes as release 0.1 wrote them, with its schema as kept in schemas/history/."""
    path = next((SCHEMA_DIR / "history").glob("threadline.ThreadState-*.avsc"))
    parsed = fastavro.parse_schema(json.loads(path.read_text()))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, record)
    return b"\xc3\x01" + schema_fingerprint(parsed) + out.getvalue()


def test_records_written_with_earlier_schema_versions_still_read() -> None:
    """Commands and events written with every earlier version of their envelope
    (release 0.1, before DeleteThread and ThreadDeleted joined the unions; before
    multitask_strategy and MessageQueued) decode with this build."""
    encode: Callable[..., bytes]
    decode: Callable[[bytes], tuple[EnvelopeMeta, Any]]
    example: Any  # a command for the one, an event for the other
    for name, encode, decode, example in (
        ("CommandEnvelope", CODEC.encode_command, CODEC.decode_command, COMMANDS[1]),
        ("EventEnvelope", CODEC.encode_event, CODEC.decode_event, EVENTS[1]),
        ("Dispatch", CODEC.encode_dispatch, CODEC.decode_dispatch, DISPATCH),
    ):
        current = fastavro.parse_schema(load_schema(str(SCHEMA_DIR / f"threadline.{name}.avsc")))
        record = fastavro.schemaless_reader(io.BytesIO(encode(example, META)[10:]), current, None,
                                           return_record_name=True)
        paths = sorted((SCHEMA_DIR / "history").glob(f"threadline.{name}-*.avsc"))
        assert paths
        for path in paths:
            parsed = fastavro.parse_schema(json.loads(path.read_text()))
            body = io.BytesIO()
            fastavro.schemaless_writer(body, parsed, record)  # the old version's fields only
            data = b"\xc3\x01" + schema_fingerprint(parsed) + body.getvalue()
            assert decode(data) == (META, example), path.name


def test_dispatch_and_dead_letter_round_trip() -> None:
    """Dispatches and dead letters round-trip."""
    for dispatch in (DISPATCH, DISPATCH_WITH_JOURNAL):
        assert CODEC.decode_dispatch(CODEC.encode_dispatch(dispatch, META)) == (META, dispatch)
    for dead_letter in DEAD_LETTERS:
        assert CODEC.decode_dead_letter(CODEC.encode_dead_letter(dead_letter)) == dead_letter


def test_new_meta_has_defaults_and_a_fresh_uuid() -> None:
    """new_meta makes a fresh UUID envelope id with schema version 1 and optional trace context."""
    a, b = new_meta(T, "acme", 5), new_meta(T, "acme", 5, traceparent="00-x-y-01")
    assert a.envelope_id != b.envelope_id and len(a.envelope_id) == 36
    assert (a.traceparent, a.tracestate, a.schema_version) == (None, None, 1)
    assert b.traceparent == "00-x-y-01"
    assert CODEC.decode_event(CODEC.encode_event(EVENTS[0], a))[0] == a


@given(st.binary(min_size=16, max_size=16))
@example(bytes(16))
@example(b"\xff" * 16)
def test_uuid4_text_is_the_uuid4_of_the_same_bytes(raw: bytes) -> None:
    """uuid4_text (random_uuid's, on 16 bytes of os.urandom) is uuid.uuid4()'s text."""
    made = uuid4_text(raw)
    assert made == str(uuid.UUID(bytes=raw, version=4))
    assert uuid.UUID(made).version == 4 and uuid.UUID(made).variant == uuid.RFC_4122
    assert uuid.UUID(random_uuid()).version == 4


def test_envelope_and_payload_thread_must_agree() -> None:
    """A command whose envelope names another thread cannot be encoded."""
    with pytest.raises(ValueError, match="thread_id"):
        CODEC.encode_command(COMMANDS[0], new_meta("other-thread", "acme", 1))


def test_encoding_an_event_as_a_command_is_a_type_error() -> None:
    """Encoding an event as a command raises TypeError."""
    with pytest.raises(TypeError, match="ThreadCreated is not one of"):
        CODEC.encode_command(EVENTS[0], META)  # type: ignore[arg-type]


_INT32 = st.integers(-(2**31), 2**31 - 1)
_INT64 = st.integers(-(2**63), 2**63 - 1)


def _strategy(cls: type) -> st.SearchStrategy[Any]:
    """hypothesis' own inference, with ints bounded to what the Avro field holds
    (in nested records too)."""
    hints = get_type_hints(cls)
    ints: dict[str, st.SearchStrategy[Any]] = {}
    for f in fields(cls):
        bounded = _INT64 if f.name.endswith("_ms") else _INT32
        if hints[f.name] is int:
            ints[f.name] = bounded
        elif hints[f.name] == int | None:
            ints[f.name] = st.none() | bounded
        elif is_dataclass(hints[f.name]):
            ints[f.name] = _strategy(hints[f.name])
        elif hints[f.name] == tuple[int, ...]:
            ints[f.name] = st.lists(bounded, max_size=3).map(tuple)
        elif get_origin(hints[f.name]) is tuple and isinstance(item := get_args(hints[f.name])[0], type) \
                and is_dataclass(item):
            ints[f.name] = st.lists(_strategy(item), max_size=3).map(tuple)  # e.g. copied messages
        elif (members := get_args(hints[f.name])) and all(is_dataclass(m) for m in members):
            ints[f.name] = st.one_of([_strategy(m) for m in members])  # e.g. a stream part
    return st.builds(cls, **ints)


@pytest.mark.parametrize(
    "cls", [*get_args(Command), *get_args(Event)], ids=lambda c: c.__name__
)
@hsettings(max_examples=40)
@given(data=st.data(), produced_at_ms=_INT64)
def test_hypothesis_round_trip(cls: type, data: st.DataObject, produced_at_ms: int) -> None:
    """Random commands and events of every type round-trip."""
    value = data.draw(_strategy(cls))
    meta = EnvelopeMeta("id", value.thread_id, "t", produced_at_ms, None, "s", 7)
    if cls in _all(Command):
        assert CODEC.decode_command(CODEC.encode_command(value, meta)) == (meta, value)
    else:
        assert CODEC.decode_event(CODEC.encode_event(value, meta)) == (meta, value)


_STATE_STRATEGY = st.builds(
    ThreadState,
    created_at_ms=_INT64,
    active_run=st.none() | _strategy(ActiveRun),
    idempotency=st.dictionaries(st.text(), _strategy(IdempotencyRecord),
                                max_size=3).map(MappingProxyType),
    message_count=_INT64,
    run_count=_INT64,
    copied_from=st.none() | st.text(),
    import_parts_left=st.integers(0, 2**31 - 1),
    last_run=st.none() | _strategy(RunRecord),
    updated_at_ms=_INT64,
)


@hsettings(max_examples=60)
@given(state=_STATE_STRATEGY)
def test_hypothesis_state_round_trip(state: ThreadState) -> None:
    """Random thread states round-trip."""
    assert CODEC.decode_state(CODEC.encode_state(state)) == state


@hsettings(max_examples=60)
@given(state=_STATE_STRATEGY)
@example(state=STATES[1])  # a key and every optional record set
def test_a_state_read_without_its_keys_is_the_state_less_its_keys(state: ThreadState) -> None:
    """`decode_state_without_keys` (the gateway's read store) reads everything else of
    a state as `decode_state` does; its truncations are still refused."""
    data = CODEC.encode_state(state)
    assert CODEC.decode_state_without_keys(data) == replace(state, idempotency=MappingProxyType({}))
    for cut in range(10, len(data), max(1, len(data) // 64)):  # past the header
        with pytest.raises(DecodeError):
            CODEC.decode_state_without_keys(data[:cut])


def test_an_earlier_versions_state_reads_without_its_keys_too() -> None:
    """A state of an earlier schema version (resolved through fastavro) loses its keys too."""
    old = _STATES_SCHEMA_V1_RECORD | {
        "idempotency": {"k1": {"message_id": "m1", "run_id": "r1", "payload_fingerprint": "fp",
                "at_ms": 1}}}
    data = _write_v1_state(old)
    assert CODEC.decode_state(data).idempotency
    assert CODEC.decode_state_without_keys(data) == replace(
        CODEC.decode_state(data), idempotency=MappingProxyType({}))


def _fastavro_bytes(name: str, record: dict[str, Any]) -> bytes:
    """`record` written by fastavro's public writer with the schema file, header first:
    optional records as bare dicts, which it matches to a branch by validating them."""
    parsed = load_schema(str(SCHEMA_DIR / f"{name}.avsc"), _write_hint=False)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, record)
    return b"\xc3\x01" + schema_fingerprint(parsed) + out.getvalue()


@hsettings(max_examples=60)
@given(state=_STATE_STRATEGY)
@example(state=STATES[1])  # every optional record set
def test_a_state_is_written_byte_for_byte_as_fastavro_writes_its_plain_record(
        state: ThreadState) -> None:
    """The binding names each optional record's branch (fastavro then skips validating
    the record to pick it): the bytes are those fastavro writes for the bare record."""
    plain = _plain(state) | {"messages": [], "runs": {}, "run_by_message": {}}
    assert CODEC.encode_state(state) == _fastavro_bytes("threadline.ThreadState", plain)


@hsettings(max_examples=30)
@given(state=_STATE_STRATEGY, keys=st.integers(0, 300), seconds=st.integers(0, 2**40))
# The fewer keys' map one short of KEYS_KEPT_FROM, so not kept (seed 9667710941424585420's
# run: the test counted two kept maps wherever the first was kept).
@example(state=STATES[0], keys=KEYS_KEPT_FROM, seconds=0)
def test_a_state_with_many_keys_is_written_as_fastavro_writes_it_whether_its_keys_are_kept(
        state: ThreadState, keys: int, seconds: int) -> None:
    """From 8 keys on, a state's key map is written apart and its bytes kept by the
    map's identity: a state that shares the map (made from the first) is written with
    the kept bytes, a new map anew; each time the bytes fastavro writes."""
    codec = Codec()  # its own kept maps
    many = MappingProxyType({f"key-{i}": IdempotencyRecord(f"m{i}", f"r{i}", f"sha256:{i:x}", i)
                             for i in range(keys)})
    first = replace(state, idempotency=many)
    later = replace(first, updated_at_ms=seconds, title=f"{state.title}, later")
    fewer = replace(later, idempotency=MappingProxyType(dict(list(many.items())[1:])))
    for written in (first, later, first, fewer, later):
        plain = _plain(written) | {"messages": [], "runs": {}, "run_by_message": {}}
        assert codec.encode_state(written) == _fastavro_bytes("threadline.ThreadState", plain)
    # many, then fewer (less one key), each from KEYS_KEPT_FROM keys on
    assert codec.kept_key_maps == (keys >= KEYS_KEPT_FROM) + (keys - 1 >= KEYS_KEPT_FROM)


def test_kept_key_maps_are_bounded() -> None:
    """The kept bytes are the newest KEYS_KEPT maps'."""
    codec = Codec()
    for n in range(KEYS_KEPT + 20):
        keys = MappingProxyType({f"k{i}": IdempotencyRecord("m", "r", "fp", n) for i in range(8)})
        codec.encode_state(ThreadState(T, "acme", "t", 1, idempotency=keys))
    assert codec.kept_key_maps == KEYS_KEPT


def test_a_stream_record_is_written_byte_for_byte_as_fastavro_writes_its_plain_record() -> None:
    """The same for the stream's parts, a run's end with its optional message among them."""
    assert any(isinstance(part, RunLifecycle) and part.message is not None for part in PARTS)
    for part in PARTS:
        output = StreamOutput("r1", 1, "m-a1", "part-0", 7, part)
        plain = _plain(META) | _plain(output) | {
            "payload": (f"threadline.{type(part).__name__}", _plain(part))}
        assert CODEC.encode_stream(output, META) == \
            _fastavro_bytes("threadline.StreamEnvelope", plain), part


@hsettings(max_examples=60)
@given(output=_strategy(StreamOutput), meta=_strategy(EnvelopeMeta))
# The strategy once drew a branch_seq past a long (seed 17809214902810247756): a
# stream part's ints are bounded too; the largest long round-trips.
@example(output=StreamOutput("r", 1, "a", "lifecycle", 0,
                             RunLifecycle("run_completed", "m", "", None, 2**63 - 1)),
         meta=META)
def test_hypothesis_stream_round_trip(output: StreamOutput, meta: EnvelopeMeta) -> None:
    """Random stream outputs round-trip."""
    assert CODEC.decode_stream(CODEC.encode_stream(output, meta)) == (meta, output)


# --- schemas and dataclasses cannot drift --------------------------------------


def _avsc(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SCHEMA_DIR / f"{name}.avsc").read_text())
    return data


def _names(schema: Any) -> Iterator[str]:
    """Every threadline.* name a schema refers to."""
    if isinstance(schema, str):
        if schema.startswith("threadline."):
            yield schema
    elif isinstance(schema, list):
        for branch in schema:
            yield from _names(branch)
    elif isinstance(schema, dict):
        for f in schema.get("fields", []):
            yield from _names(f["type"])
        for key in ("items", "values"):
            if key in schema:
                yield from _names(schema[key])


def _union(name: str) -> list[str]:
    payload = next(f for f in _avsc(name)["fields"] if f["name"] == "payload")
    return list(payload["type"])


def test_every_command_and_event_class_has_a_schema_and_vice_versa() -> None:
    """Each command, event and stream part class has its schema file and envelope branch, and no more."""
    assert {f"threadline.{c.__name__}" for c in _all(Command)} == set(
        _union("threadline.CommandEnvelope")
    )
    assert {f"threadline.{c.__name__}" for c in _all(Event)} == set(
        _union("threadline.EventEnvelope")
    )
    assert {f"threadline.{c.__name__}" for c in _all(StreamPart)} == set(
        _union("threadline.StreamEnvelope")
    )
    for cls in (*_all(Command), *_all(Event), *_all(StreamPart)):
        assert (SCHEMA_DIR / f"threadline.{cls.__name__}.avsc").is_file()


def test_schema_files_are_flat_named_documented_and_all_used() -> None:
    """Every schema file is named as its record, documented, valid, and used by a top-level schema."""
    files = {p.stem for p in SCHEMA_DIR.glob("*.avsc")}
    used = set(TOP_LEVEL_SCHEMAS)
    todo = list(TOP_LEVEL_SCHEMAS)
    while todo:
        for name in _names(_avsc(todo.pop())):
            if name not in used:
                used.add(name)
                todo.append(name)
    assert files == used, "every file is reachable from a top-level schema, and exists"
    for name in files:
        schema = _avsc(name)
        assert f"{schema['namespace']}.{schema['name']}" == name
        assert schema["namespace"] == "threadline"
        assert schema.get("doc"), f"{name} has no doc"
        load_schema(str(SCHEMA_DIR / f"{name}.avsc"))


_AVRO_TYPE = {str: "string", bool: "boolean", bytes: "bytes", float: "double"}


def _expected_avro(name: str, hint: Any) -> Any:
    if hint is int:
        longs = ("_ms", "_count", "_seq", "_seqs")  # times, and counts and positions that only grow
        return "long" if name.endswith(longs) or name in ("seq", "source_offset") else "int"
    if hint in _AVRO_TYPE:
        return _AVRO_TYPE[hint]
    args = get_args(hint)
    if get_origin(hint) is tuple:
        return {"type": "array", "items": _expected_avro(name, args[0])}
    if get_origin(hint) is Mapping:
        return {"type": "map", "values": _expected_avro(name, args[1])}
    if args and type(None) in args:
        (inner,) = (a for a in args if a is not type(None))
        return ["null", _expected_avro(name, inner)]
    if args:
        return [f"threadline.{a.__name__}" for a in args]
    assert isinstance(hint, type) and (is_dataclass(hint) or issubclass(hint, Enum))
    return f"threadline.{hint.__name__}"


def _field_types(cls: type) -> list[tuple[str, Any]]:
    hints = get_type_hints(cls)
    return [(f.name, _expected_avro(f.name, hints[f.name])) for f in fields(cls)]


def _schema_types(name: str) -> list[tuple[str, Any]]:
    return [(f["name"], f["type"]) for f in _avsc(name)["fields"]]


BOUND = [
    *get_args(Command), *get_args(Event), *get_args(StreamPart),
    Step, Citation, AssistantMessage, HistoryMessage, DeadLetter,
    StoredMessage, ActiveRun, RunRecord, IdempotencyRecord, ThreadState,
]
# Fields kept in a schema for records written before they were dropped from the
# dataclass: written with their default, read only by `CODEC.decode_legacy_history`.
LEGACY_FIELDS = {"threadline.ThreadState": {"messages", "runs", "run_by_message"}}


@pytest.mark.parametrize("cls", BOUND, ids=lambda c: c.__name__)
def test_record_fields_mirror_the_dataclass(cls: type) -> None:
    """Each schema's fields are its dataclass's fields in order and type, plus defaulted legacy fields."""
    name = f"threadline.{cls.__name__}"
    legacy = LEGACY_FIELDS.get(name, set())
    assert [t for t in _schema_types(name) if t[0] not in legacy] == _field_types(cls)
    for field in _avsc(name)["fields"]:
        if field["name"] in legacy:
            assert "default" in field and field["doc"].startswith("Legacy")


def test_top_level_records_are_envelope_plus_body() -> None:
    """Each top-level record is the envelope's fields followed by its body's."""
    envelope = _field_types(EnvelopeMeta)
    assert _schema_types("threadline.Dispatch") == envelope + _field_types(Dispatch)
    assert _schema_types("threadline.StreamEnvelope") == envelope + _field_types(StreamOutput)
    assert _schema_types("threadline.MessageRecord") == envelope + _field_types(MessageRecord)
    for name in ("threadline.CommandEnvelope", "threadline.EventEnvelope"):
        assert [n for n, _ in _schema_types(name)] == [n for n, _ in envelope] + ["payload"]
        assert _schema_types(name)[:-1] == envelope


def test_optional_fields_default_to_null_and_enum_symbols_are_the_values() -> None:
    """Optional fields are null-first with a null default; enum symbols are the Python values."""
    for path in SCHEMA_DIR.glob("*.avsc"):
        for f in json.loads(path.read_text()).get("fields", []):
            if isinstance(f["type"], list) and "null" in f["type"]:
                assert f["type"][0] == "null" and f["default"] is None, (path.name, f)
    assert _avsc("threadline.RejectReason")["symbols"] == [r.value for r in RejectReason]
    assert _avsc("threadline.RunStatus")["symbols"] == [r.value for r in RunStatus]


# --- fingerprints and readers that are not ours --------------------------------


@pytest.mark.parametrize(
    ("schema", "expected"),
    [  # Apache Avro's published vectors, share/test/data/schema-tests.txt
        ("null", 7195948357588979594),
        ("int", 8247732601305521295),
        ({"type": "record", "name": "foo", "fields": [{"name": "f1", "type": "boolean"}]},
         7843277075252814651),
    ],
)
def test_fingerprint_matches_the_spec_vectors_little_endian(schema: Any, expected: int) -> None:
    """Our schema fingerprints match Apache Avro's published CRC-64 vectors."""
    assert int.from_bytes(schema_fingerprint(schema), "little", signed=True) == expected


def _apache_schemas(directory: Path) -> avro.name.Names:
    """Parse every .avsc into one Apache Avro name table, dependencies first."""
    names = avro.name.Names()
    docs = {p.stem: json.loads(p.read_text()) for p in directory.glob("*.avsc")}

    def define(name: str) -> None:
        if names.has_name(name, None):
            return
        for dependency in _names(docs[name]):
            if dependency != name:
                define(dependency)
        avro.schema.make_avsc_object(docs[name], names)

    for name in docs:
        define(name)
    return names


@pytest.fixture(scope="module")
def apache() -> avro.name.Names:
    """The schema files as parsed by the Apache Avro library."""
    return _apache_schemas(SCHEMA_DIR)


def _plain(value: Any) -> Any:
    """A dataclass as the dict a generic Avro reader returns (independent of our code)."""
    if is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Enum):
        return value.value
    return value


def _named(names: avro.name.Names, name: str) -> avro.schema.NamedSchema:
    schema = names.get_name(name, None)
    assert schema is not None, name
    return schema


def _apache_read(names: avro.name.Names, name: str, data: bytes) -> Any:
    schema = _named(names, name)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == schema.fingerprint("CRC-64-AVRO")
    decoder = avro.io.BinaryDecoder(io.BytesIO(data[10:]))
    return avro.io.DatumReader(schema).read(decoder)


def test_apache_avro_reads_every_record_with_only_the_schema_files(
    apache: avro.name.Names,
) -> None:
    """Apache Avro, given only the schema files, reads every record we write."""
    meta = _plain(META)
    for command in COMMANDS:
        got = _apache_read(apache, "threadline.CommandEnvelope", CODEC.encode_command(command, META))
        assert got == meta | {"payload": _plain(command)}
    for event in EVENTS:
        got = _apache_read(apache, "threadline.EventEnvelope", CODEC.encode_event(event, META))
        assert got == meta | {"payload": _plain(event)}
    for part in PARTS:
        output = StreamOutput("r1", 1, "m-a1", "part-0", 7, part)
        got = _apache_read(apache, "threadline.StreamEnvelope", CODEC.encode_stream(output, META))
        assert got == meta | _plain(output)
    got = _apache_read(apache, "threadline.Dispatch", CODEC.encode_dispatch(DISPATCH, META))
    assert got == meta | _plain(DISPATCH)
    for dead_letter in DEAD_LETTERS:
        got = _apache_read(apache, "threadline.DeadLetter", CODEC.encode_dead_letter(dead_letter))
        assert got == _plain(dead_letter)
    legacy: dict[str, Any] = {"messages": [], "runs": {}, "run_by_message": {}}
    for state in STATES:
        got = _apache_read(apache, "threadline.ThreadState", CODEC.encode_state(state))
        assert got == _plain(state) | legacy
    for record in MESSAGES:
        got = _apache_read(apache, "threadline.MessageRecord", CODEC.encode_message(record, META))
        assert got == meta | _plain(record)


def test_we_read_what_apache_avro_writes(apache: avro.name.Names) -> None:
    """We decode the records Apache Avro writes from the schema files."""
    def write(name: str, datum: dict[str, Any]) -> bytes:
        schema = _named(apache, name)
        out = io.BytesIO(b"\xc3\x01" + schema.fingerprint("CRC-64-AVRO"))
        out.seek(0, io.SEEK_END)
        avro.io.DatumWriter(schema).write(datum, avro.io.BinaryEncoder(out))
        return out.getvalue()

    # Payloads chosen so that Apache Avro's pick-the-first-matching-branch union
    # writer picks the intended record.
    meta = _plain(META)
    command = COMMANDS[0]
    data = write("threadline.CommandEnvelope", meta | {"payload": _plain(command)})
    assert CODEC.decode_command(data) == (META, command)
    data = write("threadline.Dispatch", meta | _plain(DISPATCH))
    assert CODEC.decode_dispatch(data) == (META, DISPATCH)
    for letter in DEAD_LETTERS:
        assert CODEC.decode_dead_letter(write("threadline.DeadLetter", _plain(letter))) == letter
    for state in STATES:
        datum = _plain(state) | {"messages": [], "runs": {}, "run_by_message": {}}
        assert CODEC.decode_state(write("threadline.ThreadState", datum)) == state
    for record in MESSAGES:
        data = write("threadline.MessageRecord", meta | _plain(record))
        assert CODEC.decode_message(data) == (META, record)


def test_schema_registry_maps_header_fingerprints_to_self_contained_schemas(
    apache: avro.name.Names,
) -> None:
    """The fingerprint map holds one self-contained schema per top-level record, under its fingerprint."""
    registry = schema_registry()
    assert len(registry) == len(TOP_LEVEL_SCHEMAS)
    assert CODEC.encode_command(COMMANDS[0], META)[2:10] in registry
    for fp, schema in registry.items():
        assert avro.schema.parse(json.dumps(schema)).fingerprint("CRC-64-AVRO") == fp
        assert _named(apache, schema["name"]).fingerprint("CRC-64-AVRO") == fp


# --- malformed bytes -----------------------------------------------------------

DECODERS: list[Callable[[bytes], object]] = [
    CODEC.decode_command, CODEC.decode_event, CODEC.decode_dispatch, CODEC.decode_stream,
    CODEC.decode_dead_letter, CODEC.decode_state,
]
GOOD = CODEC.encode_command(COMMANDS[6], META)
HEADERS = [b"\xc3\x01" + fp for fp in schema_registry()]  # in TOP_LEVEL_SCHEMAS order


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\xc3", "marker"),
        (b"\xc3\x02" + GOOD[2:], "marker"),
        (b"\x7b" + GOOD[1:], "unknown wire format"),
        (b"{}", "unknown wire format"),
        (GOOD[:9], "truncated single-object header"),
        (GOOD[:2] + bytes(8) + GOOD[10:], "unknown schema fingerprint"),
        (GOOD[:-1], "malformed threadline.CommandEnvelope body"),
        (GOOD + b"\x00", "1 trailing bytes"),
        (CODEC.encode_event(EVENTS[0], META), "is a threadline.EventEnvelope"),
        (b"\x00\x00\x00\x00\x01" + GOOD[10:], "no schema registry is configured"),
        (b"\x00\x00\x01", "truncated Confluent header"),
    ],
)
def test_malformed_bytes_raise_decode_error(data: bytes, message: str) -> None:
    """Each kind of malformed bytes raises DecodeError with a message naming the fault."""
    with pytest.raises(DecodeError, match=message):
        CODEC.decode_command(data)


def test_every_truncation_of_every_example_raises_decode_error() -> None:
    """Every cut-short encoding of every command raises DecodeError."""
    for command in COMMANDS:
        data = CODEC.encode_command(command, META)
        for end in range(len(data)):
            with pytest.raises(DecodeError):
                CODEC.decode_command(data[:end])


def test_a_payload_for_another_thread_is_malformed() -> None:
    """A command whose payload names another thread than its envelope is malformed."""
    schema = load_schema(str(SCHEMA_DIR / "threadline.CommandEnvelope.avsc"))
    body = io.BytesIO()
    payload = ("threadline.CheckDeadlines", _plain(CheckDeadlines("another-thread", 1)))
    fastavro.schemaless_writer(body, schema, _plain(META) | {"payload": payload})
    with pytest.raises(DecodeError, match="thread_id"):
        CODEC.decode_command(GOOD[:10] + body.getvalue())


@hsettings(max_examples=300)
@given(data=st.binary(max_size=200))
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    """Random bytes raise DecodeError from every decoder, never another error."""
    for decode in DECODERS:
        with pytest.raises(DecodeError):
            decode(data)


@hsettings(max_examples=300)
@given(body=st.binary(max_size=200), which=st.sampled_from(range(len(DECODERS))))
def test_random_bodies_behind_a_valid_header_decode_or_raise_decode_error(
    body: bytes, which: int
) -> None:
    """Random bodies behind a valid header decode or raise DecodeError, nothing else."""
    with contextlib.suppress(DecodeError):
        DECODERS[which](HEADERS[which] + body)


# --- the Confluent wire format against a real registry ---------------------------
# `schema_registry_url` (tests/conftest.py): Apicurio Registry, built from Maven
# Central, its Confluent-compatible API. One registry per session: each test writes
# under its own topic prefix, so its subjects are its own.


@pytest.fixture
def topics() -> TopicNames:
    """Topic names under a fresh prefix, so registry subjects do not clash across tests."""
    return TopicNames.with_prefix(f"t{uuid.uuid4().hex[:12]}.")


def _registry_client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url})


def test_confluent_round_trip_registers_one_subject_per_topic(
        schema_registry_url: str, topics: TopicNames) -> None:
    """Everything written in the Confluent format through a registry reads back, one subject per topic."""
    writer = Codec(ConfluentRegistry(schema_registry_url), topics)
    reader = Codec(ConfluentRegistry(schema_registry_url), topics)  # looks each id up
    for command in COMMANDS:
        data = writer.encode_command(command, META)
        assert data[0] == 0 and int.from_bytes(data[1:5], "big") >= 1
        assert reader.decode_command(data) == (META, command)
    for event in EVENTS:
        assert reader.decode_event(writer.encode_event(event, META)) == (META, event)
    output = StreamOutput("r1", 1, "m-a1", "p", 3, TextDelta("x"))
    assert reader.decode_stream(writer.encode_stream(output, META)) == (META, output)
    assert reader.decode_dispatch(writer.encode_dispatch(DISPATCH, META)) == (META, DISPATCH)
    data = writer.encode_dead_letter(DEAD_LETTERS[0])
    assert reader.decode_dead_letter(data) == DEAD_LETTERS[0]
    assert reader.decode_state(writer.encode_state(STATES[1])) == STATES[1]
    data = writer.encode_message(MESSAGES[0], META)
    assert reader.decode_message(data) == (META, MESSAGES[0])
    ours = {s for s in _registry_client(schema_registry_url).get_subjects()
            if s.startswith(topics.commands.split(".")[0])}
    assert ours == {f"{t}-value" for t in topics.all()}


def test_the_registry_serves_our_schema_under_the_records_id(
        schema_registry_url: str, topics: TopicNames) -> None:
    """The schema id in a record fetches from the registry a schema that reads it."""
    data = Codec(ConfluentRegistry(schema_registry_url), topics).encode_event(EVENTS[0], META)
    registered = _registry_client(schema_registry_url).get_schema(int.from_bytes(data[1:5], "big"))
    assert registered.schema_type in (None, "AVRO")
    writer = fastavro.parse_schema(json.loads(registered.schema_str or ""))
    record = fastavro.schemaless_reader(io.BytesIO(data[5:]), writer, None)
    assert isinstance(record, dict) and record["envelope_id"] == META.envelope_id


def test_roles_registering_at_once_get_one_id(schema_registry_url: str, topics: TopicNames) -> None:
    """Six codecs registering the same schemas at once all get the same ids."""
    # Processor, worker and gateway start together: Apicurio answers all but one of
    # the racing first registrations of a subject 409 "already exists".
    codecs = [Codec(ConfluentRegistry(schema_registry_url), topics) for _ in range(6)]
    with ThreadPoolExecutor(len(codecs)) as pool:
        list(pool.map(lambda c: c.register_schemas(), codecs))
    assert len({c.state_header() for c in codecs}) == 1


def test_prepare_looks_up_another_producers_id_before_the_decode(
        schema_registry_url: str, topics: TopicNames) -> None:
    """prepare() fetches unseen schema ids up front, so the decode needs no registry."""
    # The asyncio roles call `prepare` on each batch: the lookup runs in a thread,
    # and the decode on the loop then needs no registry.
    other = Codec(ConfluentRegistry(schema_registry_url), topics)  # another producer
    data = other.encode_event(EVENTS[0], META)
    codec = Codec(ConfluentRegistry(schema_registry_url), topics)
    assert codec.unseen_ids([data, None, GOOD]) == {int.from_bytes(data[1:5], "big")}
    asyncio.run(codec.prepare([data]))
    assert codec.unseen_ids([data]) == set()
    codec.registry = None  # nothing left to ask
    assert codec.decode_event(data) == (META, EVENTS[0])
    assert Codec().unseen_ids([data]) == set()  # no registry: nothing to look up


def test_confluent_codec_still_reads_single_object_records() -> None:
    """A registry codec reads single-object records without asking the registry."""
    # Nothing listens on port 1: reading single-object records never asks the registry.
    codec = Codec(ConfluentRegistry("http://127.0.0.1:1", timeout_s=1), TOPICS)
    assert codec.decode_command(GOOD) == (META, COMMANDS[6])


def test_register_schemas_up_front(schema_registry_url: str, topics: TopicNames) -> None:
    """After register_schemas the codec writes and reads its own records with no registry."""
    codec = Codec(ConfluentRegistry(schema_registry_url), topics)
    codec.register_schemas()
    codec.registry = None  # everything it writes and reads of its own: no registry needed
    data = codec.encode_event(EVENTS[0], META)
    assert data[0] == 0 and codec.decode_event(data) == (META, EVENTS[0])
    assert codec.state_header() == codec.encode_state(STATES[1])[:5]


def test_confluent_reader_resolves_an_older_writer_schema(
        schema_registry_url: str, topics: TopicNames) -> None:
    """A record written with an older envelope schema is read with the new field's default."""
    # A producer whose envelope predates `tracestate`: the reader fills in the default.
    old = json.loads(json.dumps(schema_registry()[GOOD[2:10]]))
    old["fields"] = [f for f in old["fields"] if f["name"] != "tracestate"]
    schema_id = _registry_client(schema_registry_url).register_schema(
        f"{topics.commands}-value", RegistrySchema(json.dumps(old), "AVRO"))
    body = io.BytesIO()
    record = _plain(META) | {"payload": ("threadline.CheckDeadlines", _plain(CheckDeadlines(T, 9)))}
    fastavro.schemaless_writer(body, fastavro.parse_schema(old), record)
    data = b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()
    meta, command = Codec(ConfluentRegistry(schema_registry_url), topics).decode_command(data)
    assert meta.tracestate is None and meta.traceparent == META.traceparent
    assert command == CheckDeadlines(T, 9)


def test_unknown_confluent_id_is_malformed(schema_registry_url: str) -> None:
    """A schema id the registry does not know is a DecodeError."""
    codec = Codec(ConfluentRegistry(schema_registry_url), TOPICS)
    with pytest.raises(DecodeError, match="unknown Confluent schema id 9999999"):
        codec.decode_command(b"\x00" + (9999999).to_bytes(4, "big") + GOOD[10:])


def test_confluent_id_of_another_topic_is_malformed(
        schema_registry_url: str, topics: TopicNames) -> None:
    """An event's record decoded as a command is malformed."""
    codec = Codec(ConfluentRegistry(schema_registry_url), topics)
    with pytest.raises(DecodeError, match=r"malformed threadline\.CommandEnvelope"):
        codec.decode_command(codec.encode_event(EVENTS[0], META))


def test_unreachable_registry_is_a_registry_error_not_a_decode_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreachable registry raises RegistryError, not DecodeError, on read and write."""
    # Every attempt is made, but the pauses between them (the client's and ours, 19 s
    # in all) are skipped: what they are is not this test's subject.
    pauses: list[float] = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    server.server_close()  # nothing listens there any more
    codec = Codec(ConfluentRegistry(url, timeout_s=2), TOPICS)
    with pytest.raises(RegistryError) as caught:
        codec.decode_command(b"\x00\x00\x00\x00\x01" + GOOD[10:])
    assert not isinstance(caught.value, DecodeError)
    with pytest.raises(RegistryError):
        codec.encode_command(COMMANDS[0], META)
    assert pauses, "the requests were retried"


TOPICS = TopicNames.with_prefix("threadline.")


def test_codec_from_settings_uses_the_registry_only_when_configured() -> None:
    """The codec uses a schema registry only when its URL is set."""
    unset = Settings.from_env({"THREADLINE_SCHEMA_REGISTRY_URL": ""})
    assert Codec.from_settings(unset).registry is None
    settings = Settings.from_env({"THREADLINE_SCHEMA_REGISTRY_URL": "http://registry:8081/"})
    codec = Codec.from_settings(settings)
    assert codec.registry is not None and codec.registry.url == "http://registry:8081"


def test_confluent_codec_needs_topic_names() -> None:
    """A registry codec without topic names is refused."""
    with pytest.raises(ValueError, match="topic names"):
        Codec(ConfluentRegistry("http://127.0.0.1:1"))


def test_records_module_is_pure_data() -> None:
    """streams.core.records holds only dataclasses and unions of them."""
    # Only dataclasses and unions of them: the mapping to Avro is derived, not written.
    for name in records.__all__:
        value = getattr(records, name)
        assert is_dataclass(value) or set(get_args(value)) <= set(_all(StreamPart))
