"""The compiled Avro writer writes fastavro's bytes: on generated records of every
schema (unions of records as bare dicts and in the tuple notation the bindings
use), and on the unions whose branch fastavro picks by validating the value."""

from __future__ import annotations

import random
from typing import Any

import pytest
from fastavro._write import write_data  # type: ignore[attr-defined]
from fastavro.schema import parse_schema
from fastavro.utils import generate_many
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.wire.writer import compile_writer
from tests.streams.wire.test_reader import SCHEMAS

OPTIONS = {"strict": False, "strict_allow_default": False, "disable_tuple_notation": False}


def _fastavro(schema: Any, named: dict[str, Any], value: Any) -> bytes:
    out = bytearray()
    write_data(out, value, schema, named, "", OPTIONS)
    return bytes(out)


def _compiled(schema: Any, named: dict[str, Any], value: Any) -> bytes:
    out = bytearray()
    compile_writer(schema, named)(out, value)
    return bytes(out)


@pytest.mark.parametrize(("name", "schema", "named"), SCHEMAS, ids=[s[0] for s in SCHEMAS])
def test_generated_records_are_written_as_fastavro_writes_them(
        name: str, schema: Any, named: dict[str, Any]) -> None:
    """fastavro's generated records of every schema (a union's record a bare dict)."""
    random.seed(name)
    writer = compile_writer(schema, named)
    for record in generate_many(schema, 200):
        out = bytearray(b"\xc3\x01")  # after a header, as the codec writes
        writer(out, record)
        assert bytes(out[2:]) == _fastavro(schema, named, record)


def _named_as(name: str) -> Any:
    return lambda value: (name, value)


def _values(schema: Any, named: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values of `schema`, a union of several records in ("<full name>", record)
    notation, as `streams.wire.binding` writes them."""
    if isinstance(schema, str) and schema in named:
        schema = named[schema]
    kind = schema if isinstance(schema, str) else (
        "union" if isinstance(schema, list) else schema["type"])
    small = depth > 3  # random states nest deep: keep them small
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "int":
        return st.integers(-(2**31), 2**31 - 1)
    if kind == "long":
        return st.integers(-(2**63), 2**63 - 1)
    if kind in ("float", "double"):
        return st.floats(allow_nan=False, width=32 if kind == "float" else 64)
    if kind == "string":
        return st.text(max_size=80)
    if kind == "bytes":
        return st.binary(max_size=80)
    if kind == "fixed":
        return st.binary(min_size=schema["size"], max_size=schema["size"])
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(_values(schema["items"], named, depth + 1), max_size=0 if small else 3)
    if kind == "map":
        return st.dictionaries(st.text(max_size=10), _values(schema["values"], named, depth + 1),
                               max_size=0 if small else 3)
    if kind in ("record", "error"):
        return st.fixed_dictionaries({f["name"]: _values(f["type"], named, depth + 1)
                                      for f in schema["fields"]})
    assert kind == "union"
    resolved = [named.get(b, b) if isinstance(b, str) else b for b in schema]
    records = [b for b in resolved if isinstance(b, dict) and b["type"] in ("record", "error")]
    options = []
    for branch in resolved:
        values = _values(branch, named, depth + 1)
        if len(records) > 1 and branch in records:
            values = values.map(_named_as(branch["name"]))
        options.append(values)
    return st.one_of(options)


@pytest.mark.parametrize(("name", "schema", "named"), SCHEMAS, ids=[s[0] for s in SCHEMAS])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_records_in_tuple_notation_are_written_as_fastavro_writes_them(
        name: str, schema: Any, named: dict[str, Any], data: st.DataObject) -> None:
    """Random records of every schema as the bindings give them (the branch of a union
    of records named)."""
    record = data.draw(_values(schema, named))
    assert _compiled(schema, named, record) == _fastavro(schema, named, record)


def _field(field_type: Any, named: dict[str, Any]) -> Any:
    """A record of one field `v` of `field_type` (its named types in `named`)."""
    return parse_schema({"type": "record", "name": "t.R", "fields": [
        {"name": "v", "type": field_type}]}, named)


ENUM = {"type": "enum", "name": "t.E", "symbols": ["a", "b"]}
FIXED = {"type": "fixed", "name": "t.F", "size": 2}
REC_A = {"type": "record", "name": "t.A", "fields": [{"name": "x", "type": "long"}]}
REC_B = {"type": "record", "name": "t.B", "fields": [{"name": "x", "type": "long"},
                                                      {"name": "y", "type": "string"}]}


@pytest.mark.parametrize(("union", "values"), [
    # an int: the first branch that takes it, in range
    (["int", "long"], [0, 5, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**40]),
    (["null", "int", "double"], [None, 3, 2**33, 1.5]),
    (["double", "long"], [3, 2**40, 0.25]),
    # a float prefers a later double
    (["float", "double"], [0.1, 3]),
    (["float", "null"], [0.5, None]),
    # a bool is a boolean, never an int
    (["int", "boolean"], [True, False, 1]),
    # a string: an enum takes only its symbols
    (["t.E", "string"], ["a", "b", "c"]),
    (["string", "t.E"], ["a", "c"]),
    # bytes: a fixed takes only its size
    (["t.F", "bytes"], [b"ab", b"abc", b""]),
    # dicts: one record, a map, two records (fastavro's most-fields rule)
    (["null", "t.A"], [None, {"x": 1}]),
    (["null", {"type": "map", "values": "long"}], [None, {"k": 2}]),
    (["t.A", "t.B"], [{"x": 1}, {"x": 1, "y": "z"}, ("t.B", {"x": 2, "y": ""}),
                      ("t.A", {"x": 3})]),
    (["t.A", {"type": "map", "values": "long"}], [{"x": 1}, {"k": 1}]),
    # the tuple notation names primitives too
    (["null", "string", "long"], [("string", "s"), ("long", 7), ("null", None), "t", 8]),
    # arrays
    (["null", {"type": "array", "items": "string"}], [None, [], ["a", "b"]]),
])
def test_a_union_writes_the_branch_fastavro_picks(union: list[Any], values: list[Any]) -> None:
    """Where fastavro validates a value to pick its branch, the same branch is written."""
    named: dict[str, Any] = {}
    for schema in (ENUM, FIXED, REC_A, REC_B):
        parse_schema(schema, named)
    schema = _field(union, named)
    for value in values:
        assert _compiled(schema, named, {"v": value}) == _fastavro(schema, named, {"v": value}), value


@pytest.mark.parametrize(("union", "value"), [
    (["null", "long"], "text"),
    (["null", "string"], ("bytes", b"x")),
    (["int", "null"], 2**40),
    (["t.E"], "c"),
])
def test_a_value_that_fits_no_branch_is_refused_as_fastavro_refuses_it(
        union: list[Any], value: Any) -> None:
    """A value no branch takes raises ValueError, from both writers."""
    named: dict[str, Any] = {}
    parse_schema(ENUM, named)
    schema = _field(union, named)
    with pytest.raises(ValueError):
        _fastavro(schema, named, {"v": value})
    with pytest.raises(ValueError):
        _compiled(schema, named, {"v": value})


def test_a_missing_field_is_written_as_its_default_as_fastavro_writes_it() -> None:
    """A record without a field that has a default: the default's bytes."""
    named: dict[str, Any] = {}
    schema = parse_schema({"type": "record", "name": "t.D", "fields": [
        {"name": "a", "type": "long"},
        {"name": "b", "type": ["null", "string"], "default": None},
        {"name": "c", "type": "int", "default": 7},
        {"name": "d", "type": {"type": "array", "items": "long"}, "default": []}]}, named)
    for record in ({"a": 1}, {"a": 2, "b": "x"}, {"a": 3, "c": -4, "d": [1, 2]}):
        assert _compiled(schema, named, record) == _fastavro(schema, named, record)


@pytest.mark.parametrize("field_type", ["long", "int"])
@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**70])
def test_an_integer_beyond_a_long_is_refused_as_fastavro_refuses_it(field_type: str,
                                                                   value: int) -> None:
    """Not written as a varint no reader takes: OverflowError, as from fastavro (which
    writes an `int` field's value beyond 32 bits as a long, and so does this writer)."""
    named: dict[str, Any] = {}
    schema = _field(field_type, named)
    with pytest.raises(OverflowError):
        _fastavro(schema, named, {"v": value})
    with pytest.raises(OverflowError):
        _compiled(schema, named, {"v": value})
    for inside in (2**63 - 1, -(2**63), 2**40):
        assert _compiled(schema, named, {"v": inside}) == _fastavro(schema, named, {"v": inside})
