"""The compiled Avro reader reads what fastavro reads, the same way, and refuses
malformed bytes: parity on generated records of every schema, on single-byte
corruptions of them, and an error for every truncation."""

from __future__ import annotations

import io
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import load_schema, parse_schema
from fastavro.utils import generate_many
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.avro_reader import compile_reader
from streams.serialization import SCHEMA_DIR, TOP_LEVEL_SCHEMAS

MALFORMED = (IndexError, ValueError, UnicodeDecodeError, struct.error)


def _schemas() -> list[tuple[str, Any, dict[str, Any]]]:
    names = [*TOP_LEVEL_SCHEMAS]
    paths = [SCHEMA_DIR / f"{n}.avsc" for n in names]
    paths += sorted((SCHEMA_DIR / "connectors").glob("*.avsc"))
    out = []
    for path in paths:
        parsed = load_schema(str(path))
        named: dict[str, Any] = {}
        parse_schema(parsed, named)
        out.append((Path(path).stem, parsed, named))
    return out


SCHEMAS = _schemas()


def _fastavro(schema: Any, data: bytes) -> tuple[Any, int]:
    body = io.BytesIO(data)
    value = schemaless_reader(body, schema, None, return_record_name=True,
                              return_record_name_override=True)
    return value, body.tell()


def _encode(schema: Any, record: Any) -> bytes:
    body = io.BytesIO()
    schemaless_writer(body, schema, record)
    return body.getvalue()


@pytest.mark.parametrize(("name", "schema", "named"), SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_generated_records_read_as_fastavro_reads_them(name: str, schema: Any,
                                                       named: dict[str, Any]) -> None:
    random.seed(name)
    reader = compile_reader(schema, named)
    for record in generate_many(schema, 200):
        data = _encode(schema, record)
        assert reader(data, 0) == _fastavro(schema, data)
        # at an offset, as after a wire header
        assert reader(b"\xc3\x01" + data, 2) == (_fastavro(schema, data)[0], len(data) + 2)


@pytest.mark.parametrize(("name", "schema", "named"), SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_every_truncation_is_refused(name: str, schema: Any, named: dict[str, Any]) -> None:
    random.seed(name)
    reader = compile_reader(schema, named)
    for record in generate_many(schema, 20):
        data = _encode(schema, record)
        for cut in range(len(data)):
            with pytest.raises(MALFORMED):
                reader(data[:cut], 0)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_corrupted_byte_is_refused_or_read_as_fastavro_reads_it(data: st.DataObject) -> None:
    _name, schema, named = data.draw(st.sampled_from(SCHEMAS))
    random.seed(data.draw(st.integers(0, 2**32)))
    encoded = bytearray(_encode(schema, next(iter(generate_many(schema, 1)))))
    at = data.draw(st.integers(0, len(encoded) - 1))
    encoded[at] = data.draw(st.integers(0, 255))
    corrupted = bytes(encoded)
    try:
        ours = compile_reader(schema, named)(corrupted, 0)
    except MALFORMED:
        return  # refused; fastavro may read garbage as something, we need not
    assert ours == _fastavro(schema, corrupted)


def test_refuses_what_fastavro_would_silently_misread() -> None:
    schema = parse_schema({"type": "record", "name": "t.R", "fields": [
        {"name": "kind", "type": {"type": "enum", "name": "t.K", "symbols": ["a", "b"]}},
        {"name": "maybe", "type": ["null", "string"]},
        {"name": "items", "type": {"type": "array", "items": "long"}}]})
    reader = compile_reader(schema)
    assert reader(bytes([2, 2, 2, ord("x"), 2, 6, 0]), 0) == (
        {"kind": "b", "maybe": "x", "items": [3]}, 7)
    for bad in (bytes([0x03, 0, 0]),  # enum index -2
                bytes([4, 0, 0]),  # enum index 2 of 2 symbols
                bytes([0, 4, 0]),  # union index 2 of 2 branches
                bytes([0, 2, 0x7F, 0]),  # string of -64 bytes
                bytes([0, 0, 0x7E, 2]),  # an array of 63 longs in 1 byte
                bytes([0, 0, *([0xFF] * 11)]),  # a varint longer than 10 bytes
                bytes([0, 0, 2, *([0xFF] * 9), 0x02, 0])):  # a long beyond 64 bits
        with pytest.raises(MALFORMED):
            reader(bad, 0)
