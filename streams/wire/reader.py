"""Avro binary decoding compiled per schema into straight-line Python.

fastavro's `schemaless_reader` walks (re-parses) the whole writer schema on every
call: for the stream record, a union of nine parts, that was about 20 µs of the
40-70 µs a decode took, on every record the gateway, the worker and the
processor read. `compile_reader` turns a parsed schema into one Python function
per named record, once, that reads the bytes field by field.

The output is exactly fastavro's for `return_record_name=True,
return_record_name_override=True` (dicts in field order; a union's record branch
as `(name, dict)` unless the union holds a single record; enums as symbols), so
the dataclass bindings of `streams.wire.binding` apply unchanged;
`tests/streams/wire/test_reader.py` checks it against fastavro on generated
records, and that malformed bytes raise. It reads the writer schema only, with no
schema resolution: records of another schema version still go through fastavro.

A reader can leave out fields (`skip`: "<record full name>.<field>", arrays and
maps only): their bytes are stepped over, lengths and counts checked but nothing
built (strings not decoded), and the field reads as empty. The gateway indexes
every thread state it reads and needs none of its idempotency keys, up to 256 of
the state's records (`Codec.decode_state_without_keys`).

Malformed input raises IndexError, ValueError, UnicodeDecodeError or
struct.error; the caller turns those into its DecodeError. Where fastavro reads
bytes no writer produces (a boolean byte other than 0 or 1, an `int` beyond 32
bits), this reader refuses them rather than guess.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection
from typing import Any

from streams.wire.compiled import SchemaCompiler, compile_source

__all__ = ["Reader", "compile_reader"]

Reader = Callable[[bytes, int], tuple[Any, int]]

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_AVRO_TYPES = _PRIMITIVES | {"fixed", "enum", "record", "error", "array", "map", "union",
                             "request", "error_union"}
_MAX_ZERO_WIDTH_ITEMS = 1 << 20  # an array of empty records cannot be bounded by its bytes


def _long(b: bytes, p: int) -> tuple[int, int]:
    n = b[p]
    p += 1
    if n < 0x80:
        return (n >> 1) ^ -(n & 1), p
    n &= 0x7F
    shift = 7
    while True:
        x = b[p]
        p += 1
        n |= (x & 0x7F) << shift
        if x < 0x80:
            if n >> 64:
                raise ValueError("varint beyond 64 bits")
            return (n >> 1) ^ -(n & 1), p
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _string(b: bytes, p: int) -> tuple[str, int]:
    n, p = _long(b, p)
    end = p + n
    if n < 0 or end > len(b):
        raise ValueError(f"string of {n} bytes at {p} runs past the end ({len(b)})")
    return b[p:end].decode(), end


def _bytes(b: bytes, p: int) -> tuple[bytes, int]:
    n, p = _long(b, p)
    end = p + n
    if n < 0 or end > len(b):
        raise ValueError(f"bytes of {n} at {p} run past the end ({len(b)})")
    return b[p:end], end


def _int(b: bytes, p: int) -> tuple[int, int]:
    n, p = _long(b, p)
    if not -0x8000_0000 <= n <= 0x7FFF_FFFF:
        raise ValueError(f"int {n} before {p} is beyond 32 bits")
    return n, p


def _boolean(b: bytes, p: int) -> tuple[bool, int]:
    x = b[p]
    if x > 1:
        raise ValueError(f"boolean byte {x} at {p} is neither 0 nor 1")
    return x == 1, p + 1


_unpack_double = struct.Struct("<d").unpack_from
_unpack_float = struct.Struct("<f").unpack_from


def _double(b: bytes, p: int) -> tuple[float, int]:
    return _unpack_double(b, p)[0], p + 8


def _float(b: bytes, p: int) -> tuple[float, int]:
    return _unpack_float(b, p)[0], p + 4


def _null(b: bytes, p: int) -> tuple[None, int]:
    return None, p


def _single_record_union(branches: list[Any]) -> bool:
    """fastavro's rule for leaving a branch's name out: one record in the union,
    counting any reference to a named type as a record."""
    records = 0
    for branch in branches:
        kind = branch["type"] if isinstance(branch, dict) else branch
        if kind == "record" or (isinstance(kind, str) and kind not in _AVRO_TYPES):
            records += 1
    return records == 1


def _block_count(b: bytes, p: int, zero_width: bool) -> tuple[int, int]:
    count, p = _long(b, p)
    if count < 0:  # a negative count is followed by the block's size in bytes
        count = -count
        _, p = _long(b, p)
    # Each item takes a byte at least: a count beyond the bytes left is malformed.
    if count > (_MAX_ZERO_WIDTH_ITEMS if zero_width else len(b) - p):
        raise ValueError(f"block of {count} items at {p} cannot fit in {len(b)} bytes")
    return count, p


def _skip_null(b: bytes, p: int) -> int:
    return p


def _skip_long(b: bytes, p: int) -> int:
    return _long(b, p)[1]


def _skip_int(b: bytes, p: int) -> int:
    return _int(b, p)[1]


def _skip_boolean(b: bytes, p: int) -> int:
    return _boolean(b, p)[1]


def _skip_bytes(b: bytes, p: int) -> int:
    n, p = _long(b, p)
    end = p + n
    if n < 0 or end > len(b):
        raise ValueError(f"{n} bytes at {p} run past the end ({len(b)})")
    return end


def _skip_width(width: int) -> Callable[[bytes, int], int]:
    def skip(b: bytes, p: int) -> int:
        if p + width > len(b):
            raise ValueError(f"{width} bytes at {p} run past the end ({len(b)})")
        return p + width
    return skip


_HELPERS: dict[str, Any] = {
    "_long": _long, "_int": _int, "_string": _string, "_bytes": _bytes, "_boolean": _boolean,
    "_double": _double, "_float": _float, "_null": _null, "_block_count": _block_count,
    "_skip_null": _skip_null, "_skip_long": _skip_long, "_skip_int": _skip_int,
    "_skip_boolean": _skip_boolean, "_skip_bytes": _skip_bytes,
    "_skip_4": _skip_width(4), "_skip_8": _skip_width(8),
}
_PRIMITIVE_READERS = {"null": "_null", "boolean": "_boolean", "int": "_int", "long": "_long",
                      "float": "_float", "double": "_double", "bytes": "_bytes",
                      "string": "_string"}
_PRIMITIVE_SKIPPERS = {"null": "_skip_null", "boolean": "_skip_boolean", "int": "_skip_int",
                       "long": "_skip_long", "float": "_skip_4", "double": "_skip_8",
                       "bytes": "_skip_bytes", "string": "_skip_bytes"}


def _span(indent: str) -> list[str]:
    """Statements that read a string's or bytes' length at `p` into `n`, its end into
    `e` and `p` past the length, and refuse a length that runs past `size`."""
    return [f"{indent}x = b[p]",
            f"{indent}if x < 128:",
            f"{indent}    n = (x >> 1) ^ -(x & 1)",
            f"{indent}    p += 1",
            f"{indent}else:",
            f"{indent}    n, p = _long(b, p)",
            f"{indent}e = p + n",
            f"{indent}if n < 0 or e > size:",
            f"{indent}    raise ValueError(f'{{n}} bytes at {{p}} run past the end')"]


class _Compiler(SchemaCompiler):
    primitives = _PRIMITIVE_READERS

    def __init__(self, named: dict[str, Any], skip: frozenset[str] = frozenset()) -> None:
        super().__init__(named, _HELPERS)
        self.skip = skip  # "<record>.<field>": stepped over, read as empty
        self.skippers: dict[str, str] = {}  # full name -> its skipping function's name
        self.late: list[tuple[str, list[str]]] = []  # union skippers' branch tables

    def named_function(self, name: str) -> str:
        function = self.functions.get(name)
        if function is not None:
            return function
        schema = self.named[name]
        function = self.functions[name] = self.fresh("named")  # before fields: recursion
        kind = schema["type"]
        if kind in ("record", "error"):
            lines = [f"def {function}(b, p):", "    size = len(b)"]
            names = []
            for i, field in enumerate(schema["fields"]):
                if f"{name}.{field['name']}" in self.skip:
                    lines.append(f"    p = {self.skipper(field['type'])}(b, p)")
                    names.append(f"{field['name']!r}: {self.empty(name, field)}")
                    continue
                lines += self.inline(field["type"], f"v{i}", "    ")
                names.append(f"{field['name']!r}: v{i}")
            lines.append(f"    return {{{', '.join(names)}}}, p")
        elif kind == "enum":
            symbols = self.fresh("symbols")
            self.namespace[symbols] = tuple(schema["symbols"])
            lines = [f"def {function}(b, p):",
                     "    i, p = _long(b, p)",
                     f"    if not 0 <= i < {len(schema['symbols'])}:",
                     f"        raise ValueError(f'enum index {{i}} out of range for {name}')",
                     f"    return {symbols}[i], p"]
        elif kind == "fixed":
            size = int(schema["size"])
            lines = [f"def {function}(b, p):",
                     f"    if p + {size} > len(b):",
                     "        raise ValueError('truncated fixed')",
                     f"    return b[p:p + {size}], p + {size}"]
        else:
            raise NotImplementedError(f"named Avro type {kind!r}")
        self.sources.append("\n".join(lines))
        return function

    def inline(self, schema: Any, target: str, indent: str) -> list[str]:
        """Statements that read `schema` at `p` into `target` and advance `p`, inside a
        function that has `b` and `size = len(b)`. Longs and strings (most fields)
        are read in place: a call per field was half the cost of a record."""
        kind = schema if isinstance(schema, str) else (
            schema.get("type") if isinstance(schema, dict) and not schema.get("logicalType")
            else None)
        if kind in ("int", "long"):  # a one-byte varint is in range of both
            return [f"{indent}x = b[p]",
                    f"{indent}if x < 128:",
                    f"{indent}    {target} = (x >> 1) ^ -(x & 1)",
                    f"{indent}    p += 1",
                    f"{indent}else:",
                    f"{indent}    {target}, p = {_PRIMITIVE_READERS[kind]}(b, p)"]
        if kind == "string":
            return [*_span(indent), f"{indent}{target} = b[p:e].decode()", f"{indent}p = e"]
        if kind == "null":
            return [f"{indent}{target} = None"]
        if isinstance(schema, list) and len(schema) < 64:  # the index is one byte
            lines = [f"{indent}x = b[p]", f"{indent}p += 1"]
            for i, (branch, name) in enumerate(self.branches(schema)):
                lines.append(f"{indent}{'if' if i == 0 else 'elif'} x == {2 * i}:")
                if name is None:
                    lines += self.inline(branch, target, indent + "    ")
                else:
                    lines += self.inline(branch, "u", indent + "    ")
                    lines.append(f"{indent}    {target} = ({name!r}, u)")
            lines += [f"{indent}else:",
                      f"{indent}    raise ValueError(f'union index byte {{x}} out of range')"]
            return lines
        return [f"{indent}{target}, p = {self.function(schema)}(b, p)"]

    def branches(self, branches: list[Any]) -> list[tuple[Any, str | None]]:
        """Each branch of a union, with the name fastavro returns it under, if any."""
        single_record = _single_record_union(branches)
        out = []
        for branch in branches:
            name = None
            if not single_record:
                kind = branch["type"] if isinstance(branch, dict) else branch
                if kind == "record":
                    name = branch["name"]
                    self.named.setdefault(name, branch)
                elif isinstance(branch, str) and branch not in _PRIMITIVES:
                    name = self.named[branch]["name"]  # a named type by reference
            out.append((branch, name))
        return out

    def union_function(self, branches: list[Any]) -> str:
        function = self.fresh("union")
        lines = [f"def {function}(b, p):", "    size = len(b)"]
        lines += self.inline(branches, "v", "    ") if len(branches) < 64 else [
            "    raise ValueError('unions of 64 branches or more are not supported')"]
        lines.append("    return v, p")
        self.sources.append("\n".join(lines))
        return function

    def array(self, items: Any) -> str:
        function = self.fresh("array")
        read = self.function(items)
        zero = self._zero_width(items)
        self.sources.append("\n".join([
            f"def {function}(b, p):",
            "    out = []",
            f"    count, p = _block_count(b, p, {zero})",
            "    while count:",
            "        for _ in range(count):",
            f"            v, p = {read}(b, p)",
            "            out.append(v)",
            f"        count, p = _block_count(b, p, {zero})",
            "    return out, p",
        ]))
        return function

    def map(self, values: Any) -> str:
        function = self.fresh("map")
        read = self.function(values)
        self.sources.append("\n".join([
            f"def {function}(b, p):",
            "    out = {}",
            "    count, p = _block_count(b, p, False)",  # every key takes a byte at least
            "    while count:",
            "        for _ in range(count):",
            "            k, p = _string(b, p)",
            f"            out[k], p = {read}(b, p)",
            "        count, p = _block_count(b, p, False)",
            "    return out, p",
        ]))
        return function

    def empty(self, record: str, field: dict[str, Any]) -> str:
        """The value a skipped field reads as: an empty array or map."""
        kind = field["type"].get("type") if isinstance(field["type"], dict) else None
        if kind not in ("array", "map"):
            raise NotImplementedError(f"{record}.{field['name']}: only arrays and maps are skipped")
        return "[]" if kind == "array" else "{}"

    def skipper(self, schema: Any) -> str:
        """The name of a function (bytes, pos) -> pos past a value of `schema`, which
        checks what bounds the value (lengths, counts, union and enum indexes) and
        builds nothing."""
        if isinstance(schema, str):
            return _PRIMITIVE_SKIPPERS.get(schema) or self.named_skipper(schema)
        if isinstance(schema, list):
            function = self.fresh("skip_union")
            branches = [self.skipper(branch) for branch in schema]
            table = self.fresh("branches")
            self.namespace[table] = ()  # filled below, once the branches' functions exist
            self.sources.append("\n".join([
                f"def {function}(b, p):",
                "    i, p = _long(b, p)",
                f"    if not 0 <= i < {len(schema)}:",
                "        raise ValueError(f'union index {i} out of range')",
                f"    return {table}[i](b, p)"]))
            self.late.append((table, branches))
            return function
        kind = schema["type"]
        if kind in ("record", "error", "enum", "fixed"):
            self.named.setdefault(schema["name"], schema)
            return self.named_skipper(schema["name"])
        if kind in ("array", "map"):
            function = self.fresh("skip_" + kind)
            item = self.skipper(schema["items"] if kind == "array" else schema["values"])
            zero = kind == "array" and self._zero_width(schema["items"])
            key = self.inline_skip("string", " " * 12) if kind == "map" else []
            self.sources.append("\n".join([
                f"def {function}(b, p):",
                "    size = len(b)",
                f"    count, p = _block_count(b, p, {zero})",
                "    while count:",
                "        for _ in range(count):",
                *key,
                f"            p = {item}(b, p)",
                f"        count, p = _block_count(b, p, {zero})",
                "    return p"]))
            return function
        if kind in _PRIMITIVE_SKIPPERS and not schema.get("logicalType"):
            return _PRIMITIVE_SKIPPERS[kind]
        raise NotImplementedError(f"Avro type {kind!r}")

    def inline_skip(self, schema: Any, indent: str) -> list[str]:
        """Statements that step `p` over a value of `schema`, inside a function that
        has `b` and `size = len(b)`: strings and longs in place, as `inline` reads them."""
        kind = schema if isinstance(schema, str) else (
            schema.get("type") if isinstance(schema, dict) and not schema.get("logicalType")
            else None)
        if kind == "long":
            return [f"{indent}if b[p] < 128:",
                    f"{indent}    p += 1",
                    f"{indent}else:",
                    f"{indent}    p = _skip_long(b, p)"]
        if kind in ("string", "bytes"):
            return [*_span(indent), f"{indent}p = e"]
        return [f"{indent}p = {self.skipper(schema)}(b, p)"]

    def named_skipper(self, name: str) -> str:
        function = self.skippers.get(name)
        if function is not None:
            return function
        schema = self.named[name]
        function = self.skippers[name] = self.fresh("skip_named")  # before fields: recursion
        kind = schema["type"]
        if kind in ("record", "error"):
            lines = [f"def {function}(b, p):", "    size = len(b)"]
            for field in schema["fields"]:
                lines += self.inline_skip(field["type"], "    ")
            lines.append("    return p")
        else:  # an enum or a fixed: read, as cheap as stepping over it
            lines = [f"def {function}(b, p):", f"    return {self.named_function(name)}(b, p)[1]"]
        self.sources.append("\n".join(lines))
        return function

    def _zero_width(self, schema: Any) -> bool:
        if isinstance(schema, str) and schema in self.named:
            schema = self.named[schema]
        if schema == "null" or schema == {"type": "null"}:
            return True
        if isinstance(schema, dict) and schema["type"] in ("record", "error"):
            return all(self._zero_width(f["type"]) for f in schema["fields"])
        return False


def compile_reader(schema: Any, named: dict[str, Any] | None = None,
                   skip: Collection[str] = ()) -> Reader:
    """A reader of `schema` (as fastavro's `parse_schema` or `load_schema` gives it);
    `named` is the named-types dict `parse_schema` filled for it. Each field named in
    `skip` ("<record full name>.<field>", an array or a map) is stepped over and
    read as empty."""
    compiler = _Compiler(dict(named or {}), frozenset(skip))
    top = compiler.function(schema)
    source = "\n\n".join(compiler.sources) + "\n"
    exec(compile_source(source, "<avro reader>"), compiler.namespace)
    for table, functions in compiler.late:
        compiler.namespace[table] = tuple(compiler.namespace[f] for f in functions)
    reader: Reader = compiler.namespace[top]
    return reader
