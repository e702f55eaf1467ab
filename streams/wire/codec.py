"""`Codec`: the records of every core topic to and from bytes, in one wire format.

Each role builds one from its settings at start-up (`Codec.from_settings`) and
passes it down; there is no shared instance, so THREADLINE_SCHEMA_REGISTRY_URL
decides every role's format. Without a registry records are written in Avro
single-object encoding, with one in the Confluent format (`streams.wire.frame`);
decoding accepts both.

`threadline.ThreadState` is the processor's table row and changelog record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, TypeVar, get_args

from fastavro.schema import parse_schema
from fastavro.types import Schema

from streams.config import Settings, TopicNames
from streams.core.domain import (
    Command,
    Event,
    IdempotencyRecord,
    RunRecord,
    StoredMessage,
    ThreadState,
)
from streams.core.records import DeadLetter, Dispatch, MessageRecord, StreamOutput
from streams.wire.binding import binding_of, record_union
from streams.wire.envelope import EnvelopeMeta
from streams.wire.errors import DecodeError, RegistryError, SerializationError
from streams.wire.frame import (
    CONFLUENT_HEADER_LEN,
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_HEADER_LEN,
    SINGLE_OBJECT_MARKER,
    confluent_header,
    read_body,
    record_around,
    single_object_header,
    write_record,
    write_record_around,
    write_value,
)
from streams.wire.reader import compile_reader
from streams.wire.registry import ConfluentRegistry
from streams.wire.schemas import BY_FINGERPRINT, CURRENT, TopLevel, retired, schema_fingerprint

__all__ = ["Codec"]

T = TypeVar("T")

_command_to_avro, _command_from_avro = record_union(list(get_args(Command)))
_event_to_avro, _event_from_avro = record_union(list(get_args(Event)))
_META = binding_of(EnvelopeMeta)
_DISPATCH = binding_of(Dispatch)
_STREAM = binding_of(StreamOutput)
_DEAD_LETTER = binding_of(DeadLetter)
_STATE = binding_of(ThreadState)
_MESSAGE = binding_of(MessageRecord)
_STORED = binding_of(StoredMessage)
_RUN_RECORD = binding_of(RunRecord)
_COMMANDS, _EVENTS, _DISPATCHES, _STREAMS, _DEAD_LETTERS, _STATES, _MESSAGES = CURRENT.values()
_STATE_WITHOUT_KEYS = compile_reader(_STATES.parsed, _STATES.named_types,
                                     skip=("threadline.ThreadState.idempotency",))
_NO_KEYS: Mapping[str, IdempotencyRecord] = MappingProxyType({})
_KEY = binding_of(IdempotencyRecord)
_KEYS_AROUND = record_around(_STATES, "idempotency")
KEYS_KEPT_FROM = 8  # fewer keys are written with the state at once: cheaper than apart
KEYS_KEPT = 512  # key maps' bytes kept (at most ~40 KB each, at the 256-key cap)


class Codec:
    """Encodes and decodes the records of every topic in one wire format.

    Without a registry: Avro single-object encoding. With one: the Confluent
    format, subjects `<topic>-value` of `topics`. Decoding accepts both.
    """

    def __init__(
        self, registry: ConfluentRegistry | None = None, topics: TopicNames | None = None
    ) -> None:
        if registry is not None and topics is None:
            raise ValueError("the Confluent format needs the topic names for its subjects")
        self.registry = registry
        self._subjects = {} if topics is None else {
            _COMMANDS.name: f"{topics.commands}-value",
            _EVENTS.name: f"{topics.events}-value",
            _DISPATCHES.name: f"{topics.dispatch}-value",
            _STREAMS.name: f"{topics.stream}-value",
            _DEAD_LETTERS.name: f"{topics.dead_letter}-value",
            _STATES.name: f"{topics.threads}-value",
            _MESSAGES.name: f"{topics.messages}-value",
        }
        self._headers: dict[str, bytes] = {}
        self._writers: dict[int, Schema] = {}  # Confluent id -> writer schema
        # id(a state's key map) -> (the map, its bytes), the newest KEYS_KEPT.
        self._keys_written: dict[int, tuple[Mapping[str, IdempotencyRecord], bytes]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> Codec:
        """Confluent format if `settings.schema_registry_url` is set, else single-object."""
        url = settings.schema_registry_url
        return cls(ConfluentRegistry(url), settings.topics) if url else cls()

    def register_schemas(self) -> None:
        """Register every top-level schema now (a no-op without a registry).

        Blocking: asyncio roles call it through `asyncio.to_thread` at start-up."""
        for schema in CURRENT.values():
            header = self._header(schema)
            if header[0] == CONFLUENT_MAGIC:  # our own ids: read without asking again
                self._writers[int.from_bytes(header[1:], "big")] = schema.parsed

    def unseen_ids(self, values: Iterable[bytes | None]) -> set[int]:
        """The Confluent schema ids in `values` this codec has no writer schema for."""
        if self.registry is None:
            return set()
        return {int.from_bytes(v[1:CONFLUENT_HEADER_LEN], "big") for v in values
                if v and len(v) >= CONFLUENT_HEADER_LEN and v[0] == CONFLUENT_MAGIC
                } - self._writers.keys()

    def load_writers(self, schema_ids: Iterable[int]) -> None:
        """Look these ids up now (blocking). Failures are left for the decode to report."""
        for schema_id in schema_ids:
            with contextlib.suppress(SerializationError):
                self._confluent_writer(schema_id)

    async def prepare(self, values: Iterable[bytes | None]) -> None:
        """Before decoding a batch on an event loop: look up the ids it names that this
        process has not seen (another producer's, an older version) in a thread, so the
        decodes that follow never wait on the registry."""
        unseen = self.unseen_ids(values)
        if unseen:
            await asyncio.to_thread(self.load_writers, unseen)

    def state_header(self) -> bytes:
        """The wire header of thread states written by this codec with this build's
        schema (those carry no legacy history)."""
        return self._header(_STATES)

    def encode_command(self, command: Command, meta: EnvelopeMeta) -> bytes:
        """A commands-topic record; `meta.thread_id` must be the command's."""
        _same_thread(meta, command.thread_id, ValueError)
        return self._write(_COMMANDS, _META.to_avro(meta) | {"payload": _command_to_avro(command)})

    def decode_command(self, data: bytes) -> tuple[EnvelopeMeta, Command]:
        """The envelope and command of a commands-topic record; DecodeError if malformed."""
        meta, command = self._read(
            _COMMANDS, data, lambda r: (_META.from_avro(r), _command_from_avro(r["payload"]))
        )
        _same_thread(meta, command.thread_id, DecodeError)
        return meta, command

    def encode_event(self, event: Event, meta: EnvelopeMeta) -> bytes:
        """An events-topic record; `meta.thread_id` must be the event's."""
        _same_thread(meta, event.thread_id, ValueError)
        return self._write(_EVENTS, _META.to_avro(meta) | {"payload": _event_to_avro(event)})

    def decode_event(self, data: bytes) -> tuple[EnvelopeMeta, Event]:
        """The envelope and event of an events-topic record; DecodeError if malformed."""
        meta, event = self._read(
            _EVENTS, data, lambda r: (_META.from_avro(r), _event_from_avro(r["payload"]))
        )
        _same_thread(meta, event.thread_id, DecodeError)
        return meta, event

    def encode_dispatch(self, dispatch: Dispatch, meta: EnvelopeMeta) -> bytes:
        """A dispatch-topic record."""
        return self._write(_DISPATCHES, _META.to_avro(meta) | _DISPATCH.to_avro(dispatch))

    def decode_dispatch(self, data: bytes) -> tuple[EnvelopeMeta, Dispatch]:
        """The envelope and dispatch of a dispatch-topic record; DecodeError if malformed."""
        return self._read(_DISPATCHES, data, lambda r: (_META.from_avro(r), _DISPATCH.from_avro(r)))

    def encode_stream(self, output: StreamOutput, meta: EnvelopeMeta) -> bytes:
        """A stream-topic record."""
        return self._write(_STREAMS, _META.to_avro(meta) | _STREAM.to_avro(output))

    def decode_stream(self, data: bytes) -> tuple[EnvelopeMeta, StreamOutput]:
        """The envelope and output of a stream-topic record; DecodeError if malformed."""
        return self._read(_STREAMS, data, lambda r: (_META.from_avro(r), _STREAM.from_avro(r)))

    def encode_dead_letter(self, dead_letter: DeadLetter) -> bytes:
        """A dead-letter-topic record."""
        return self._write(_DEAD_LETTERS, _DEAD_LETTER.to_avro(dead_letter))

    def decode_dead_letter(self, data: bytes) -> DeadLetter:
        """A dead-letter-topic record; DecodeError if malformed."""
        dead_letter: DeadLetter = self._read(_DEAD_LETTERS, data, _DEAD_LETTER.from_avro)
        return dead_letter

    @property
    def kept_key_maps(self) -> int:
        """How many key maps' bytes `encode_state` keeps (at most KEYS_KEPT)."""
        return len(self._keys_written)

    def encode_state(self, state: ThreadState) -> bytes:
        """A thread's state, for the processor's table and its changelog topic.

        Its idempotency keys (up to 256 records, most of a long keyed thread's bytes)
        change only with a keyed post, and every command writes the state: the bytes
        written for a key map are kept by the map's identity (states are immutable,
        and a state made from another shares its map until the keys change)."""
        keys = state.idempotency
        if len(keys) < KEYS_KEPT_FROM:
            return self._write(_STATES, _STATE.to_avro(state))
        kept = self._keys_written.get(id(keys))
        if kept is not None and kept[0] is keys:
            written = kept[1]
        else:
            written = write_value(_STATES, _KEYS_AROUND[1],
                                  {k: _KEY.to_avro(v) for k, v in keys.items()})
            self._keys_written[id(keys)] = (keys, written)  # `keys` held: its id stays its
            if len(self._keys_written) > KEYS_KEPT:
                del self._keys_written[next(iter(self._keys_written))]
        return write_record_around(_STATES, self._header(_STATES),
                                   _STATE.to_avro(replace(state, idempotency=_NO_KEYS)),
                                   _KEYS_AROUND, written)

    def decode_state(self, data: bytes) -> ThreadState:
        """A thread's state from the table or changelog; DecodeError if malformed."""
        state: ThreadState = self._read(_STATES, data, _STATE.from_avro)
        return state

    def decode_state_without_keys(self, data: bytes) -> ThreadState:
        """`decode_state`, but the state's idempotency keys read as none: their bytes
        are stepped over, unbuilt (up to 256 records, most of a long thread's state).
        For readers that index states and need no key (the gateway's read store)."""
        writer, start = self._writer_schema(_STATES, data)
        state: ThreadState = read_body(_STATES, writer, data, start, _STATE.from_avro,
                                       _STATE_WITHOUT_KEYS)
        return state if writer is _STATES.parsed else replace(state, idempotency=_NO_KEYS)

    def decode_legacy_history(self, data: bytes) -> tuple[tuple[StoredMessage, ...],
                                                           dict[str, RunRecord]]:
        """The messages and runs a state written before the messages topic carries
        (both empty in newer states); DecodeError if malformed."""
        def build(r: Any) -> tuple[tuple[StoredMessage, ...], dict[str, RunRecord]]:
            return (tuple(_STORED.from_avro(m) for m in r.get("messages") or ()),
                    {k: _RUN_RECORD.from_avro(v) for k, v in (r.get("runs") or {}).items()})
        result: tuple[tuple[StoredMessage, ...], dict[str, RunRecord]] = \
            self._read(_STATES, data, build)
        return result

    def encode_message(self, record: MessageRecord, meta: EnvelopeMeta) -> bytes:
        """A messages-topic record."""
        return self._write(_MESSAGES, _META.to_avro(meta) | _MESSAGE.to_avro(record))

    def decode_message(self, data: bytes) -> tuple[EnvelopeMeta, MessageRecord]:
        """The envelope and stored message of a messages-topic record; DecodeError if malformed."""
        return self._read(_MESSAGES, data, lambda r: (_META.from_avro(r), _MESSAGE.from_avro(r)))

    def _header(self, schema: TopLevel) -> bytes:
        header = self._headers.get(schema.name)
        if header is None:
            if self.registry is None:
                header = single_object_header(schema)
            else:
                header = confluent_header(self.registry.register(
                    self._subjects[schema.name], json.dumps(schema.json)
                ))
            self._headers[schema.name] = header
        return header

    def _write(self, schema: TopLevel, record: dict[str, Any]) -> bytes:
        return write_record(schema, self._header(schema), record)

    def _read(self, expected: TopLevel, data: bytes, build: Callable[[Any], T]) -> T:
        writer, start = self._writer_schema(expected, data)
        return read_body(expected, writer, data, start, build)

    def _writer_schema(self, expected: TopLevel, data: bytes) -> tuple[Schema, int]:
        """The schema the bytes were written with, and where the body starts."""
        if not data:
            raise DecodeError("empty record: no Avro header")
        if data[0] == SINGLE_OBJECT_MARKER[0]:
            if data[1:2] != SINGLE_OBJECT_MARKER[1:]:
                raise DecodeError(f"bad single-object marker {data[:2].hex()}, expected c301")
            if len(data) < SINGLE_OBJECT_HEADER_LEN:
                raise DecodeError(f"truncated single-object header ({len(data)} bytes)")
            fp = data[2:SINGLE_OBJECT_HEADER_LEN]
            known = BY_FINGERPRINT.get(fp)
            earlier = retired().get(fp) if known is None else None
            if earlier is not None:
                if earlier[0] != expected.name:
                    raise DecodeError(f"record is an earlier {earlier[0]}, expected a {expected.name}")
                return earlier[1], SINGLE_OBJECT_HEADER_LEN
            if known is None:
                raise DecodeError(
                    f"unknown schema fingerprint {fp.hex()}: written with a schema version this "
                    f"build does not know (expected {expected.name}, {expected.fingerprint.hex()})"
                )
            if known is not expected:
                raise DecodeError(f"record is a {known.name}, expected a {expected.name}")
            return expected.parsed, SINGLE_OBJECT_HEADER_LEN
        if data[0] == CONFLUENT_MAGIC:
            if len(data) < CONFLUENT_HEADER_LEN:
                raise DecodeError(f"truncated Confluent header ({len(data)} bytes)")
            schema_id = int.from_bytes(data[1:CONFLUENT_HEADER_LEN], "big")
            return self._confluent_writer(schema_id), CONFLUENT_HEADER_LEN
        raise DecodeError(
            f"unknown wire format: first byte {data[0]:#04x}, expected 0xc3 "
            "(Avro single-object encoding) or 0x00 (Confluent)"
        )

    def _confluent_writer(self, schema_id: int) -> Schema:
        writer = self._writers.get(schema_id)
        if writer is not None:
            return writer
        if self.registry is None:
            raise DecodeError(
                f"record is in the Confluent format (schema id {schema_id}) "
                "but no schema registry is configured"
            )
        try:
            text = self.registry.lookup(schema_id)
        except RegistryError as exc:
            if exc.status == 404:  # the record names a schema that does not exist
                raise DecodeError(f"unknown Confluent schema id {schema_id}: {exc}") from exc
            raise
        try:
            parsed = parse_schema(json.loads(text))
        except Exception as exc:
            raise DecodeError(f"Confluent schema id {schema_id} is not Avro: {exc}") from exc
        known = BY_FINGERPRINT.get(schema_fingerprint(parsed))
        # Our own schema object when it is one of ours: then no resolution is needed.
        writer = self._writers[schema_id] = known.parsed if known else parsed
        return writer


def _same_thread(meta: EnvelopeMeta, thread_id: str, error: type[Exception]) -> None:
    # The record key is the envelope's thread id: a mismatch would route the
    # payload to the wrong thread's partition.
    if meta.thread_id != thread_id:
        raise error(
            f"envelope thread_id {meta.thread_id!r} differs from the payload's {thread_id!r}"
        )
