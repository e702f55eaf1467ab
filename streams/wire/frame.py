"""The two wire formats' headers, and the Avro body written and read after them.

Told apart by the first byte:

* Avro single-object encoding: `C3 01`, the 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema's Parsing Canonical Form, then the binary
  body. Any Avro library can read it with only `schemas/`.
* Confluent: `00`, the 4-byte big-endian registry id, then the body.
"""

from __future__ import annotations

from collections.abc import Callable
from io import BytesIO
from typing import Any, TypeVar

from fastavro import schemaless_reader
from fastavro.types import Schema

from streams.wire.errors import DecodeError
from streams.wire.reader import Reader
from streams.wire.schemas import TopLevel
from streams.wire.writer import Writer, compile_writer

__all__ = [
    "CONFLUENT_HEADER_LEN",
    "CONFLUENT_MAGIC",
    "SINGLE_OBJECT_HEADER_LEN",
    "SINGLE_OBJECT_MARKER",
    "confluent_header",
    "read_body",
    "record_around",
    "single_object_header",
    "write_record",
    "write_record_around",
    "write_value",
]

SINGLE_OBJECT_MARKER = b"\xc3\x01"
SINGLE_OBJECT_HEADER_LEN = 10
CONFLUENT_MAGIC = 0x00
CONFLUENT_HEADER_LEN = 5
# Writers compiled for parts of a top-level schema (`record_around`), by the part's id;
# the part is kept with its writer, so the id stays its own.
_PART_WRITERS: dict[int, tuple[Schema, Writer]] = {}

T = TypeVar("T")


def single_object_header(schema: TopLevel) -> bytes:
    """The single-object header of records written with `schema`."""
    return SINGLE_OBJECT_MARKER + schema.fingerprint


def confluent_header(schema_id: int) -> bytes:
    """The Confluent header of records written with the registry's `schema_id`."""
    return bytes([CONFLUENT_MAGIC]) + schema_id.to_bytes(4, "big")


def write_record(schema: TopLevel, header: bytes, record: dict[str, Any]) -> bytes:
    """`header`, then `record` in Avro binary with `schema` (its compiled writer:
    fastavro's bytes, `streams.wire.writer`)."""
    out = bytearray(header)
    schema.writer(out, record)
    return bytes(out)


def _part_writer(schema: TopLevel, part: Schema) -> Writer:
    kept = _PART_WRITERS.get(id(part))
    if kept is None or kept[0] is not part:
        kept = _PART_WRITERS[id(part)] = (part, compile_writer(part, schema.named_types))
    return kept[1]


def record_around(schema: TopLevel, field: str) -> tuple[Schema, Schema, Schema]:
    """(a record of the fields before `field`, `field`'s type, a record of the fields
    after it) of the top-level record `schema`: written one after the other, they are
    the record (Avro writes a record as its fields' encodings in order)."""
    assert isinstance(schema.parsed, dict)
    fields = schema.parsed["fields"]
    at = next(i for i, f in enumerate(fields) if f["name"] == field)
    return ({"type": "record", "name": f"{schema.name}.before.{field}", "fields": fields[:at]},
            fields[at]["type"],
            {"type": "record", "name": f"{schema.name}.after.{field}", "fields": fields[at + 1:]})


def write_value(schema: TopLevel, value_schema: Schema, value: Any) -> bytes:
    """`value` alone in Avro binary, with `value_schema` (a part of `schema`)."""
    out = bytearray()
    _part_writer(schema, value_schema)(out, value)
    return bytes(out)


def write_record_around(schema: TopLevel, header: bytes, record: dict[str, Any],
                        parts: tuple[Schema, Schema, Schema], middle: bytes) -> bytes:
    """`write_record` of `record`, but the field between `parts` (`record_around`)
    taken as the bytes `middle` already written for it."""
    before, _, after = parts
    out = bytearray(header)
    _part_writer(schema, before)(out, record)
    out += middle
    _part_writer(schema, after)(out, record)
    return bytes(out)


def read_body(expected: TopLevel, writer: Schema, data: bytes, start: int,
              build: Callable[[Any], T], reader: Reader | None = None) -> T:
    """`build` applied to the body at `data[start:]`, written with `writer` and read as
    `expected` (with `reader`, compiled from `expected`, where it wrote the bytes);
    DecodeError if the bytes are malformed or run on after the body."""
    try:
        if writer is expected.parsed:  # this build's schema: the compiled reader
            record, end = (reader or expected.reader)(bytes(data), start)
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
