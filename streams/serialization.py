"""Avro bytes for every Threadline topic; nothing else touches them.

The contract is `schemas/`: one `.avsc` file per named type, `<fullname>.avsc`,
and one top-level record per topic (`TOP_LEVEL_SCHEMAS`). Records mirror the
dataclasses of `streams.domain` and `streams.records` field for field; the
mapping is derived from the dataclass fields once per class, not written by hand.

Two wire formats, told apart by the first byte:

* Avro single-object encoding (the default): `C3 01`, the 8-byte little-endian
  CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form, then
  the binary body. Any Avro library can read it with only `schemas/`.
* Confluent (when a schema registry is configured): `00`, the 4-byte
  big-endian registry id, then the body; subjects are `<topic>-value`.

`threadline.ThreadState` is the processor's table row and changelog record.

Errors: `SerializationError` is the base; `DecodeError` (also a `ValueError`)
means the bytes are unusable and belong on the dead-letter topic;
`RegistryError` means the registry could not be asked, which is worth a retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from io import BytesIO
from pathlib import Path
from types import MappingProxyType, UnionType
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from confluent_kafka.schema_registry import Schema as _Schema
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro import schemaless_reader
from fastavro._write import write_data  # type: ignore[attr-defined]
from fastavro.schema import fingerprint, load_schema, parse_schema, to_parsing_canonical_form
from fastavro.types import Schema

from streams.avro_reader import Reader, compile_reader
from streams.config import Settings, TopicNames
from streams.domain import Command, Event, RunRecord, StoredMessage, ThreadState
from streams.records import DeadLetter, Dispatch, MessageRecord, StreamOutput

__all__ = [
    "SCHEMA_DIR",
    "TOP_LEVEL_SCHEMAS",
    "Codec",
    "ConfluentRegistry",
    "DecodeError",
    "EnvelopeMeta",
    "RegistryError",
    "SerializationError",
    "decode_command",
    "decode_dead_letter",
    "decode_dispatch",
    "decode_event",
    "decode_legacy_history",
    "decode_message",
    "decode_state",
    "decode_stream",
    "encode_command",
    "encode_dead_letter",
    "encode_dispatch",
    "encode_event",
    "encode_message",
    "encode_state",
    "encode_stream",
    "new_meta",
    "schema_fingerprint",
    "schema_registry",
]

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
NAMESPACE = "threadline"
TOP_LEVEL_SCHEMAS = (  # one per topic, in the order of `_SCHEMAS` below
    "threadline.CommandEnvelope",
    "threadline.EventEnvelope",
    "threadline.Dispatch",
    "threadline.StreamEnvelope",
    "threadline.DeadLetter",
    "threadline.ThreadState",  # the threads topic: the processor's table changelog
    "threadline.MessageRecord",  # the messages topic: the stored history
)
SINGLE_OBJECT_MARKER = b"\xc3\x01"
CONFLUENT_MAGIC = 0x00
_SINGLE_OBJECT_HEADER_LEN = 10
_WRITE_OPTIONS = {"strict": False, "strict_allow_default": False, "disable_tuple_notation": False}
_CONFLUENT_HEADER_LEN = 5
_REGISTER_ATTEMPTS = 6  # a race's 409, a 5xx or a timeout is retried this often

T = TypeVar("T")


class SerializationError(Exception):
    """Base of the errors of this module."""


class DecodeError(SerializationError, ValueError):
    """The bytes are not a record of the expected kind; the message says why."""


class RegistryError(SerializationError):
    """The schema registry failed or refused; `status` is the HTTP status, if any."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class EnvelopeMeta:
    """The envelope fields every topic record but dead letters carries.

    `schema_version` is the version of the Threadline record contract the
    producer followed; the Avro schema itself is named by the wire header.
    """

    envelope_id: str
    thread_id: str
    tenant: str
    produced_at_ms: int
    traceparent: str | None = None
    tracestate: str | None = None
    schema_version: int = 1


def new_meta(
    thread_id: str,
    tenant: str,
    now_ms: int,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> EnvelopeMeta:
    """Envelope fields for a new record, with a fresh random envelope id."""
    return EnvelopeMeta(str(uuid.uuid4()), thread_id, tenant, now_ms, traceparent, tracestate)


# --- dataclass <-> Avro dict, derived once per class -------------------------

_Convert = Callable[[Any], Any]


class _Binding:
    """One dataclass and its Avro record: fields copied as they are, and converted.

    `to_avro` and `from_avro` are compiled once per class into straight-line code
    (a dict display, a constructor call): the processor converts several records
    per command, and a loop over the fields with getattr cost twice as much."""

    __slots__ = ("cls", "converted", "from_avro", "plain", "to_avro")

    to_avro: Callable[[Any], dict[str, Any]]
    from_avro: Callable[[Mapping[str, Any]], Any]

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        hints = get_type_hints(cls)
        plain: list[str] = []
        converted: list[tuple[str, _Convert, _Convert]] = []
        _BINDINGS[cls] = self  # before the fields, so recursive types terminate
        for f in fields(cls):
            conversion = _conversion(hints[f.name])
            if conversion is None:
                plain.append(f.name)
            else:
                converted.append((f.name, *conversion))
        self.plain = tuple(plain)
        self.converted = tuple(converted)
        self._compile()

    def _compile(self) -> None:
        # Field names are the dataclass's own identifiers, so the source is safe.
        namespace: dict[str, Any] = {"_cls": self.cls}
        encode = [f"{name!r}: o.{name}" for name in self.plain]
        decode = [f"{name}=r[{name!r}]" for name in self.plain]
        for i, (name, to_avro, from_avro) in enumerate(self.converted):
            namespace[f"_e{i}"], namespace[f"_d{i}"] = to_avro, from_avro
            encode.append(f"{name!r}: _e{i}(o.{name})")
            decode.append(f"{name}=_d{i}(r[{name!r}])")
        source = (f"def to_avro(o):\n    return {{{', '.join(encode)}}}\n"
                  f"def from_avro(r):\n    return _cls({', '.join(decode)})\n")
        exec(compile(source, f"<avro binding of {self.cls.__name__}>", "exec"), namespace)
        self.to_avro = namespace["to_avro"]
        self.from_avro = namespace["from_avro"]


_BINDINGS: dict[type[Any], _Binding] = {}
_PLAIN_TYPES = (str, int, bool, float, bytes, type(None))


def _binding(cls: type[Any]) -> _Binding:
    return _BINDINGS.get(cls) or _Binding(cls)


def _avro_name(cls: type[Any]) -> str:
    return f"{NAMESPACE}.{cls.__name__}"


def _conversion(tp: Any) -> tuple[_Convert, _Convert] | None:
    """(to Avro, from Avro) for a field type, or None if fastavro takes it as it is."""
    if tp in _PLAIN_TYPES:
        return None
    origin, args = get_origin(tp), get_args(tp)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _conversion(args[0])
        if item is None:
            return list, tuple
        enc, dec = item
        return (lambda v: [enc(x) for x in v]), (lambda v: tuple(dec(x) for x in v))
    if origin is Mapping and args[0] is str:  # frozen maps: MappingProxyType
        value = _conversion(args[1])
        if value is None:
            return dict, lambda v: MappingProxyType(v)
        enc, dec = value
        return (lambda v: {k: enc(x) for k, x in v.items()}), (
            lambda v: MappingProxyType({k: dec(x) for k, x in v.items()})
        )
    if origin in (UnionType, Union):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:  # Optional: ["null", T]
            inner = _conversion(members[0])
            if inner is None:
                return None
            enc, dec = inner
            return (lambda v: None if v is None else enc(v)), (
                lambda v: None if v is None else dec(v)
            )
        records = all(isinstance(m, type) and is_dataclass(m) for m in members)
        if records and len(members) == len(args):
            return _record_union(members)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return (lambda e: e.value), tp  # Avro symbols are the enum values
    if isinstance(tp, type) and is_dataclass(tp):
        binding = _binding(tp)
        if not hasattr(binding, "to_avro"):  # a recursive type, still being compiled
            return (lambda v: binding.to_avro(v)), (lambda v: binding.from_avro(v))
        return binding.to_avro, binding.from_avro
    raise TypeError(f"no Avro mapping for the field type {tp!r}")


def _record_union(members: list[type[Any]]) -> tuple[_Convert, _Convert]:
    """A union of records, written in fastavro's ("name", record) tuple notation."""
    by_class = {m: (_avro_name(m), _binding(m).to_avro) for m in members}
    by_name = {_avro_name(m): _binding(m).from_avro for m in members}

    def encode(value: Any) -> tuple[str, dict[str, Any]]:
        try:
            name, to_avro = by_class[type(value)]
        except KeyError:
            raise TypeError(f"{type(value).__name__} is not one of {sorted(by_name)}") from None
        return name, to_avro(value)

    def decode(value: tuple[str, Mapping[str, Any]]) -> Any:
        name, record = value
        return by_name[name](record)

    return encode, decode


_command_to_avro, _command_from_avro = _record_union(list(get_args(Command)))
_event_to_avro, _event_from_avro = _record_union(list(get_args(Event)))
_META = _binding(EnvelopeMeta)
_DISPATCH = _binding(Dispatch)
_STREAM = _binding(StreamOutput)
_DEAD_LETTER = _binding(DeadLetter)
_STATE = _binding(ThreadState)
_MESSAGE = _binding(MessageRecord)
_STORED = _binding(StoredMessage)
_RUN_RECORD = _binding(RunRecord)


# --- schemas and fingerprints ------------------------------------------------


def schema_fingerprint(schema: Schema) -> bytes:
    """The 8 bytes of the single-object header: CRC-64-AVRO of the canonical form.

    fastavro gives the fingerprint as hex of the little-endian bytes, which is
    the order the spec puts on the wire (checked against the spec's test vectors).
    """
    canonical = to_parsing_canonical_form(parse_schema(schema))
    return bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


@dataclass(frozen=True, slots=True)
class _TopLevel:
    name: str
    parsed: Schema
    fingerprint: bytes
    named_types: dict[str, Any]  # fastavro's named schemas of `parsed`, for write_data
    reader: Reader  # compiled from `parsed`: records written with this very schema

    @property
    def json(self) -> dict[str, Any]:
        """The schema with every named type inlined, without fastavro's own keys."""
        assert isinstance(self.parsed, dict)
        return {k: v for k, v in self.parsed.items() if not k.startswith("__")}


def _load(name: str, directory: Path) -> _TopLevel:
    parsed = load_schema(str(directory / f"{name}.avsc"))
    named_types: dict[str, Any] = {}
    parse_schema(parsed, named_types)
    return _TopLevel(name, parsed, schema_fingerprint(parsed), named_types,
                     compile_reader(parsed, named_types))


def schema_registry(directory: Path = SCHEMA_DIR) -> dict[bytes, dict[str, Any]]:
    """{fingerprint: schema} of the top-level schemas in `directory`, named types inlined."""
    loaded = (_load(name, directory) for name in TOP_LEVEL_SCHEMAS)
    return {s.fingerprint: s.json for s in loaded}


_SCHEMAS = {name: _load(name, SCHEMA_DIR) for name in TOP_LEVEL_SCHEMAS}
_BY_FINGERPRINT = {s.fingerprint: s for s in _SCHEMAS.values()}
HISTORY_DIR = SCHEMA_DIR / "history"


def _retired(directory: Path = HISTORY_DIR) -> dict[bytes, tuple[str, Schema]]:
    """{fingerprint: (top-level name, writer schema)} of the earlier versions of the
    top-level schemas (`schemas/history/<name>-<fingerprint>.avsc`, named types
    inlined): records already on the topics were written with them, and a reader of
    this build resolves them to the current version."""
    found: dict[bytes, tuple[str, Schema]] = {}
    for path in sorted(directory.glob("*.avsc")):
        name = path.stem.rsplit("-", 1)[0]
        parsed = parse_schema(json.loads(path.read_text()))
        found[schema_fingerprint(parsed)] = (name, parsed)
    return found


_RETIRED = _retired()
_COMMANDS, _EVENTS, _DISPATCHES, _STREAMS, _DEAD_LETTERS, _STATES, _MESSAGES = _SCHEMAS.values()


# --- the Confluent schema registry -------------------------------------------


class ConfluentRegistry:
    """The schema registry, through `confluent_kafka.schema_registry`'s client.

    Blocking: the client caches ids both ways, so each schema costs one request
    per process. Call `Codec.register_schemas` at start-up, off the event loop
    (`asyncio.to_thread` in the asyncio roles), to keep requests off the hot path.
    Any registry with the Confluent REST API will do (Apicurio Registry's is at
    `/apis/ccompat/v7`, which the tests run).
    """

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._client = SchemaRegistryClient({
            "url": self.url, "timeout": max(1, round(timeout_s)), "max.retries": 2,
        })

    def register(self, subject: str, schema: str) -> int:
        """The id of `schema` (JSON text) under `subject`, registering it if new.

        Roles start together and register the same schemas: Apicurio answers the
        loser of a race to create a subject 409 "already exists" (seen with the
        processor, worker and gateway starting at once); asked again, it answers
        the id. Registrations at once can also make it answer 500 (its H2 store's
        lock timed out) or time out: transient, so retried with a growing pause. A
        4xx other than 409, or any error that persists, is raised."""
        for attempt in range(_REGISTER_ATTEMPTS):
            try:
                return self._call(f"register {subject}", lambda: self._client.register_schema(
                    subject, _Schema(schema, "AVRO")))
            except RegistryError as exc:
                transient = exc.status is None or exc.status == 409 or exc.status >= 500
                if not transient or attempt == _REGISTER_ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    def lookup(self, schema_id: int) -> str:
        """The schema (JSON text) registered under `schema_id`."""
        found = self._call(f"schema id {schema_id}", lambda: self._client.get_schema(schema_id))
        return str(found.schema_str)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except SchemaRegistryError as exc:
            status = exc.http_status_code if exc.http_status_code > 0 else None
            raise RegistryError(f"{what}: {exc}", status) from exc
        except Exception as exc:  # connection refused, timeouts: the HTTP layer's own errors
            raise RegistryError(f"{what}: {type(exc).__name__}: {exc}") from exc


# --- encoding and decoding -----------------------------------------------------


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

    @classmethod
    def from_settings(cls, settings: Settings) -> Codec:
        """Confluent format if `settings.schema_registry_url` is set, else single-object."""
        url = settings.schema_registry_url
        return cls(ConfluentRegistry(url), settings.topics) if url else cls()

    def register_schemas(self) -> None:
        """Register every top-level schema now (a no-op without a registry).

        Blocking: asyncio roles call it through `asyncio.to_thread` at start-up."""
        for schema in _SCHEMAS.values():
            header = self._header(schema)
            if header[0] == CONFLUENT_MAGIC:  # our own ids: read without asking again
                self._writers[int.from_bytes(header[1:], "big")] = schema.parsed

    def unseen_ids(self, values: Iterable[bytes | None]) -> set[int]:
        """The Confluent schema ids in `values` this codec has no writer schema for."""
        if self.registry is None:
            return set()
        return {int.from_bytes(v[1:_CONFLUENT_HEADER_LEN], "big") for v in values
                if v and len(v) >= _CONFLUENT_HEADER_LEN and v[0] == CONFLUENT_MAGIC
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

    def encode_state(self, state: ThreadState) -> bytes:
        """A thread's state, for the processor's table and its changelog topic."""
        return self._write(_STATES, _STATE.to_avro(state))

    def decode_state(self, data: bytes) -> ThreadState:
        """A thread's state from the table or changelog; DecodeError if malformed."""
        state: ThreadState = self._read(_STATES, data, _STATE.from_avro)
        return state

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

    def _header(self, schema: _TopLevel) -> bytes:
        header = self._headers.get(schema.name)
        if header is None:
            if self.registry is None:
                header = SINGLE_OBJECT_MARKER + schema.fingerprint
            else:
                schema_id = self.registry.register(
                    self._subjects[schema.name], json.dumps(schema.json)
                )
                header = bytes([CONFLUENT_MAGIC]) + schema_id.to_bytes(4, "big")
            self._headers[schema.name] = header
        return header

    def _write(self, schema: _TopLevel, record: dict[str, Any]) -> bytes:
        # fastavro's write_data straight into a bytearray: schemaless_writer would
        # also re-collect the named types and wrap a BytesIO on every call (40% of it).
        out = bytearray(self._header(schema))
        write_data(out, record, schema.parsed, schema.named_types, "", _WRITE_OPTIONS)
        return bytes(out)

    def _read(self, expected: _TopLevel, data: bytes, build: Callable[[Any], T]) -> T:
        writer, start = self._writer_schema(expected, data)
        try:
            if writer is expected.parsed:  # this build's schema: the compiled reader
                record, end = expected.reader(bytes(data), start)
            else:  # another version: fastavro resolves it to ours
                body = BytesIO(data)
                body.seek(start)
                record = schemaless_reader(body, writer, expected.parsed,
                                           return_record_name=True,
                                           return_record_name_override=True)
                end = body.tell()
            value = build(record)
        except Exception as exc:  # whatever malformed bytes make the reader raise
            raise DecodeError(
                f"malformed {expected.name} body: {type(exc).__name__}: {exc}"
            ) from exc
        if end != len(data):
            raise DecodeError(f"{len(data) - end} trailing bytes after the {expected.name} body")
        return value

    def _writer_schema(self, expected: _TopLevel, data: bytes) -> tuple[Schema, int]:
        """The schema the bytes were written with, and where the body starts."""
        if not data:
            raise DecodeError("empty record: no Avro header")
        if data[0] == SINGLE_OBJECT_MARKER[0]:
            if data[1:2] != SINGLE_OBJECT_MARKER[1:]:
                raise DecodeError(f"bad single-object marker {data[:2].hex()}, expected c301")
            if len(data) < _SINGLE_OBJECT_HEADER_LEN:
                raise DecodeError(f"truncated single-object header ({len(data)} bytes)")
            fp = data[2:_SINGLE_OBJECT_HEADER_LEN]
            known = _BY_FINGERPRINT.get(fp)
            retired = _RETIRED.get(fp)
            if known is None and retired is not None:
                if retired[0] != expected.name:
                    raise DecodeError(f"record is an earlier {retired[0]}, expected a {expected.name}")
                return retired[1], _SINGLE_OBJECT_HEADER_LEN
            if known is None:
                raise DecodeError(
                    f"unknown schema fingerprint {fp.hex()}: written with a schema version this "
                    f"build does not know (expected {expected.name}, {expected.fingerprint.hex()})"
                )
            if known is not expected:
                raise DecodeError(f"record is a {known.name}, expected a {expected.name}")
            return expected.parsed, _SINGLE_OBJECT_HEADER_LEN
        if data[0] == CONFLUENT_MAGIC:
            if len(data) < _CONFLUENT_HEADER_LEN:
                raise DecodeError(f"truncated Confluent header ({len(data)} bytes)")
            schema_id = int.from_bytes(data[1:_CONFLUENT_HEADER_LEN], "big")
            return self._confluent_writer(schema_id), _CONFLUENT_HEADER_LEN
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
        known = _BY_FINGERPRINT.get(schema_fingerprint(parsed))
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


# The single-object codec, for code with no settings (tests, benchmarks, tools).
# Roles never use these: each builds its own from its settings (`Codec.from_settings`),
# so THREADLINE_SCHEMA_REGISTRY_URL decides their format.
_DEFAULT = Codec()
encode_command = _DEFAULT.encode_command
decode_command = _DEFAULT.decode_command
encode_event = _DEFAULT.encode_event
decode_event = _DEFAULT.decode_event
encode_dispatch = _DEFAULT.encode_dispatch
decode_dispatch = _DEFAULT.decode_dispatch
encode_stream = _DEFAULT.encode_stream
decode_stream = _DEFAULT.decode_stream
encode_dead_letter = _DEFAULT.encode_dead_letter
decode_dead_letter = _DEFAULT.decode_dead_letter
encode_state = _DEFAULT.encode_state
decode_state = _DEFAULT.decode_state
decode_legacy_history = _DEFAULT.decode_legacy_history
encode_message = _DEFAULT.encode_message
decode_message = _DEFAULT.decode_message
