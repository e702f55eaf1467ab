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
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streams.wire import SCHEMA_DIR, TOP_LEVEL_SCHEMAS
from streams.wire.reader import compile_reader

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
    """Our compiled readers read random records of every schema exactly as fastavro does, at any offset."""
    random.seed(name)
    reader = compile_reader(schema, named)
    for record in generate_many(schema, 200):
        data = _encode(schema, record)
        assert reader(data, 0) == _fastavro(schema, data)
        # at an offset, as after a wire header
        assert reader(b"\xc3\x01" + data, 2) == (_fastavro(schema, data)[0], len(data) + 2)


@pytest.mark.parametrize(("name", "schema", "named"), SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_every_truncation_is_refused(name: str, schema: Any, named: dict[str, Any]) -> None:
    """Cut-short encodings of every schema's records are refused as malformed: every
    cut of a record up to 512 bytes; of a longer one (a random state's maps and
    arrays reach tens of KiB, and each cut reads the prefix again) every cut in its
    first and last 256 bytes and 256 evenly spaced between."""
    random.seed(name)
    reader = compile_reader(schema, named)
    for record in generate_many(schema, 20):
        data = _encode(schema, record)
        for cut in _cuts(len(data)):
            with pytest.raises(MALFORMED):
                reader(data[:cut], 0)


def _cuts(size: int) -> list[int]:
    if size <= 512:
        return list(range(size))
    between = range(256, size - 256, max(1, (size - 512) // 256))
    return sorted({*range(256), *between, *range(size - 256, size)})


SCHEMA_NAMES = [s[0] for s in SCHEMAS]


# A boolean byte of 2 (issue 12: fastavro reads it as True, the compiled reader read False).
@example(name="threadline.OutboxEntry", seed=0, at=99, byte=2)
@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(SCHEMA_NAMES), seed=st.integers(0, 2**32), at=st.integers(0, 2**16),
       byte=st.integers(0, 255))
def test_a_corrupted_byte_is_refused_or_read_as_fastavro_reads_it(name: str, seed: int, at: int,
                                                                   byte: int) -> None:
    """A record with one byte changed is either refused or read just as fastavro reads it."""
    _name, schema, named = SCHEMAS[SCHEMA_NAMES.index(name)]
    random.seed(seed)
    encoded = bytearray(_encode(schema, next(iter(generate_many(schema, 1)))))
    encoded[at % len(encoded)] = byte
    corrupted = bytes(encoded)
    try:
        ours = compile_reader(schema, named)(corrupted, 0)
    except MALFORMED:
        return  # refused; fastavro may read garbage as something, we need not
    assert ours == _fastavro(schema, corrupted)


_FLAG_AND_COUNT = parse_schema({"type": "record", "name": "t.FlagAndCount", "fields": [
    {"name": "flag", "type": "boolean"}, {"name": "count", "type": "int"}]})


@example(byte=2)  # fastavro reads any byte but 0 as True; we read it as False (issue 12)
@example(byte=255)
@given(st.integers(0, 255))
def test_a_boolean_byte_is_0_or_1_or_refused(byte: int) -> None:
    """A boolean byte other than 0 or 1 is refused, where fastavro reads it as true."""
    data = bytes([byte, 0])
    reader = compile_reader(_FLAG_AND_COUNT)
    if byte in (0, 1):
        assert reader(data, 0) == _fastavro(_FLAG_AND_COUNT, data)
    else:
        with pytest.raises(MALFORMED):
            reader(data, 0)


@example(value=2**31)  # a varint past the 32 bits of an Avro int was read as a Python int
@example(value=-(2**31) - 1)
@example(value=2**31 - 1)
@example(value=-(2**31))
@given(st.integers(-(2**63), 2**63 - 1))
def test_an_int_beyond_32_bits_is_refused(value: int) -> None:
    """An Avro int outside 32 bits is refused, in a field, a union or an array."""
    data = b"\x00" + _encode("long", value)
    reader = compile_reader(_FLAG_AND_COUNT)
    if -(2**31) <= value < 2**31:
        assert reader(data, 0) == ({"flag": False, "count": value}, len(data))
    else:
        with pytest.raises(MALFORMED):
            reader(data, 0)
    # the same through a union and an array, which read ints out of line
    for items, item in (("int", b""), (["null", "int"], b"\x02")):
        array = b"\x02" + item + _encode("long", value) + b"\x00"
        read = compile_reader(parse_schema({"type": "array", "items": items}))
        if -(2**31) <= value < 2**31:
            assert read(array, 0) == ([value], len(array))
        else:
            with pytest.raises(MALFORMED):
                read(array, 0)


def test_refuses_what_fastavro_would_silently_misread() -> None:
    """Bad enum or union indexes, negative lengths and overlong varints are refused."""
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


def _collection_fields() -> list[tuple[str, str, Any, dict[str, Any]]]:
    """(record, field, the record's schema, named types) of every array or map field of
    every record type the schemas name."""
    out, seen = [], set()
    for _, _, named in SCHEMAS:
        for name, schema in named.items():
            if not isinstance(schema, dict) or schema.get("type") != "record" or name in seen:
                continue
            seen.add(name)
            for field in schema["fields"]:
                kind = field["type"].get("type") if isinstance(field["type"], dict) else None
                if kind in ("array", "map"):
                    out.append((name, field["name"], schema, named))
    return out


COLLECTION_FIELDS = _collection_fields()


def _standalone(schema: Any, named: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`schema` with the named types it refers to inlined at their first use, parsed:
    a record type of a top-level schema, as a schema of its own."""
    defined: set[str] = set()

    def inline(s: Any) -> Any:
        if isinstance(s, str):
            if s in named and s not in defined:
                return inline(named[s])
            return s
        if isinstance(s, list):
            return [inline(b) for b in s]
        s = {k: v for k, v in s.items() if not k.startswith("__")}
        if s["type"] in ("record", "enum", "fixed"):
            defined.add(s["name"])
        if s["type"] == "record":
            s["fields"] = [{**f, "type": inline(f["type"])} for f in s["fields"]]
        elif s["type"] == "array":
            s["items"] = inline(s["items"])
        elif s["type"] == "map":
            s["values"] = inline(s["values"])
        return s

    own: dict[str, Any] = {}
    return parse_schema(inline(schema), own), own


def test_some_fields_can_be_skipped() -> None:
    """The cases below cover the field the gateway skips, and nested records' fields."""
    skipped = {f"{record}.{field}" for record, field, _, _ in COLLECTION_FIELDS}
    assert {"threadline.ThreadState.idempotency", "threadline.ActiveRun.journal"} <= skipped


@pytest.mark.parametrize(("record", "field", "schema", "named"), COLLECTION_FIELDS,
                         ids=[f"{r}.{f}" for r, f, _, _ in COLLECTION_FIELDS])
def test_a_skipped_field_reads_as_empty_and_the_rest_as_without_skipping(
        record: str, field: str, schema: Any, named: dict[str, Any]) -> None:
    """A reader that skips an array or map field reads every other field as the full
    reader does, the skipped one as empty, and ends where it ends; every truncation
    is still refused."""
    random.seed(f"{record}.{field}")
    schema, named = _standalone(schema, named)
    full = compile_reader(schema, named)
    skipping = compile_reader(schema, named, skip=[f"{record}.{field}"])
    records = list(generate_many(schema, 50))
    assert any(r[field] for r in records)  # the skipped bytes were there to step over
    for value in records:
        data = _encode(schema, value)
        expected, end = full(b"\xc3\x01" + data, 2)
        expected[field] = [] if isinstance(expected[field], list) else {}
        assert skipping(b"\xc3\x01" + data, 2) == (expected, end)
    for value in records[:5]:
        data = _encode(schema, value)
        for cut in _cuts(len(data)):
            with pytest.raises(MALFORMED):
                skipping(data[:cut], 0)


def test_only_arrays_and_maps_are_skipped() -> None:
    """A field of another type has no empty value to read as: refused at compile time."""
    _, schema, named = next(s for s in SCHEMAS if s[0] == "threadline.ThreadState")
    with pytest.raises(NotImplementedError, match="only arrays and maps"):
        compile_reader(schema, named, skip=["threadline.ThreadState.title"])
