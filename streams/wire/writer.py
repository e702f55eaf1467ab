"""Avro binary encoding compiled per schema into straight-line Python.

fastavro's `write_data` walks the schema on every call: a dict lookup per field
to find its writer, and for each union a scan of its branches, validating the
value against each until one fits. It was the processor's busiest function
(17% of its samples under py-spy at 200 runs at once, issue #22) and 6% of the
worker's. `compile_writer` turns a parsed schema into one Python function per
named record, once, that appends the fields' bytes to a bytearray: longs and
strings in place, a union's branch chosen by the value's Python type.

It writes exactly fastavro's bytes for what `write_data` is given here (see
`streams.wire.frame`): dicts with every field (a missing field with a default
is written as its default, as fastavro does), a union of records in fastavro's
`("<full name>", record)` tuple notation, None for null.
`tests/streams/wire/test_writer.py` checks byte parity with fastavro on
generated records of every schema. A union whose branches a Python type cannot
tell apart (two records without the tuple notation, two branches of one kind) is
handed to fastavro's own `write_data`, for that value only.

Written by hand, as `streams.wire.reader` is: fastavro (Cython) is the fast
Avro library for Python and has no compiled-per-schema writer; `avro` is slower.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from fastavro._write import write_data  # type: ignore[attr-defined]

from streams.wire.compiled import SchemaCompiler, compile_source

__all__ = ["Writer", "compile_writer"]

Writer = Callable[[bytearray, Any], None]

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_OPTIONS = {"strict": False, "strict_allow_default": False, "disable_tuple_notation": False}


def _long(out: bytearray, n: int) -> None:
    # fastavro refuses what a long cannot hold; written, it would be a varint no reader
    # takes (ours refuses one past 10 bytes), a record every consumer dead-letters.
    if not -0x8000_0000_0000_0000 <= n <= 0x7FFF_FFFF_FFFF_FFFF:
        raise OverflowError(f"{n} does not fit in an Avro long")
    n = (n << 1) ^ (n >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _string(out: bytearray, v: str) -> None:
    e = v.encode()
    n = len(e) << 1
    if n < 128:
        out.append(n)
    else:
        _long(out, len(e))
    out += e


def _bytes(out: bytearray, v: bytes) -> None:
    _long(out, len(v))
    out += v


def _boolean(out: bytearray, v: bool) -> None:
    out.append(1 if v else 0)


def _null(out: bytearray, v: None) -> None:
    return None


_pack_double = struct.Struct("<d").pack
_pack_float = struct.Struct("<f").pack


def _double(out: bytearray, v: float) -> None:
    out += _pack_double(v)


def _float(out: bytearray, v: float) -> None:
    out += _pack_float(v)


_HELPERS: dict[str, Any] = {
    "_long": _long, "_string": _string, "_bytes": _bytes, "_boolean": _boolean,
    "_double": _double, "_float": _float, "_null": _null, "_write_data": write_data,
    "_OPTIONS": _OPTIONS,
}
_PRIMITIVE_WRITERS = {"null": "_null", "boolean": "_boolean", "int": "_long", "long": "_long",
                      "float": "_float", "double": "_double", "bytes": "_bytes",
                      "string": "_string"}

class _Compiler(SchemaCompiler):
    primitives = _PRIMITIVE_WRITERS

    def __init__(self, named: dict[str, Any]) -> None:
        super().__init__(named, _HELPERS)
        self.late: list[str] = []  # tables of function names, bound after exec

    def resolve(self, schema: Any) -> Any:
        """A named type's schema for a reference to it; anything else as it is."""
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            return self.named[schema]
        return schema

    def kind(self, schema: Any) -> str:
        schema = self.resolve(schema)
        if isinstance(schema, list):
            return "union"
        kind = schema if isinstance(schema, str) else schema["type"]
        return "record" if kind == "error" else kind

    def union_function(self, branches: list[Any]) -> str:
        function = self.fresh("union")
        self.sources.append("\n".join([f"def {function}(out, v):",
                                       *self.union(branches, "v", "    ")]))
        return function

    def named_function(self, name: str) -> str:
        function = self.functions.get(name)
        if function is not None:
            return function
        schema = self.named[name]
        function = self.functions[name] = self.fresh("named")  # before fields: recursion
        kind = schema["type"]
        if kind in ("record", "error"):
            lines = [f"def {function}(out, r):"]
            for i, field in enumerate(schema["fields"]):
                value = f"f{i}"
                if "default" in field:
                    default = self.constant("default", field["default"])
                    lines.append(f"    {value} = r.get({field['name']!r}, {default})")
                else:
                    lines.append(f"    {value} = r.get({field['name']!r})")
                lines += self.inline(field["type"], value, "    ")
            if len(lines) == 1:
                lines.append("    return None")
        elif kind == "enum":
            index = self.constant("symbols", {s: i for i, s in enumerate(schema["symbols"])})
            lines = [f"def {function}(out, v):", f"    _long(out, {index}[v])"]
        elif kind == "fixed":
            lines = [f"def {function}(out, v):", "    out += v"]
        else:
            raise NotImplementedError(f"named Avro type {kind!r}")
        self.sources.append("\n".join(lines))
        return function

    def inline(self, schema: Any, value: str, indent: str) -> list[str]:
        """Statements that append `value` written as `schema` to `out`."""
        kind = schema if isinstance(schema, str) else (
            schema.get("type") if isinstance(schema, dict) and not schema.get("logicalType")
            else None)
        if kind in ("int", "long"):
            return [f"{indent}if 0 <= {value} < 64:",
                    f"{indent}    out.append({value} << 1)",
                    f"{indent}else:",
                    f"{indent}    _long(out, {value})"]
        if kind == "string":
            return [f"{indent}e = {value}.encode()",
                    f"{indent}if len(e) < 64:",
                    f"{indent}    out.append(len(e) << 1)",
                    f"{indent}else:",
                    f"{indent}    _long(out, len(e))",
                    f"{indent}out += e"]
        if kind == "null":
            return []
        if kind == "boolean":
            return [f"{indent}out.append(1 if {value} else 0)"]
        if isinstance(schema, list):
            return self.union(schema, value, indent)
        return [f"{indent}{self.function(schema)}(out, {value})"]

    def union(self, branches: list[Any], value: str, indent: str) -> list[str]:
        """Statements that write `value` as the branch of `branches` fastavro picks for
        it: in tuple notation the branch of that name; else the first branch whose
        validation accepts the value (a float prefers a later double), which a Python
        class test (and a range or symbol check) decides here. fastavro itself writes
        what no test here decides (two records or two maps for a dict: its "most
        fields" rule; two arrays), and refuses what fits no branch."""
        tests: list[tuple[str, int]] = []
        for cls, accepts in (("NoneType", ("null",)), ("bool", ("boolean",)),
                             ("int", ("int", "long", "float", "double")),
                             ("float", ("float", "double")), ("str", ("string", "enum")),
                             ("bytes", ("bytes", "fixed")), ("list", ("array",)),
                             ("dict", ("map", "record"))):
            candidates = [i for i, b in enumerate(branches) if self.kind(b) in accepts]
            if cls in ("list", "dict") and len(candidates) > 1:
                continue  # fastavro validates the content to choose: it decides
            is_class = f"{value} is None" if cls == "NoneType" else f"{value}.__class__ is {cls}"
            for n, i in enumerate(candidates):
                kind = self.kind(branches[i])
                if kind == "float" and any(self.kind(branches[j]) == "double"
                                           for j in candidates[n + 1:]):
                    i = next(j for j in candidates[n + 1:] if self.kind(branches[j]) == "double")
                    kind = "double"
                guard = self.guard(branches[i], value)
                tests.append((is_class if guard is None else f"{is_class} and {guard}", i))
                if guard is None:
                    break
        lines: list[str] = []
        for test, i in tests:
            lines.append(f"{indent}{'elif' if lines else 'if'} {test}:")
            lines.append(f"{indent}    out.append({2 * i})")
            lines += self.inline(branches[i], value, indent + "    ")
        # fastavro's tuple notation, ("<branch name>", value): a tuple fits no test above.
        names = self.constant("branches", {
            self.branch_name(b): (2 * i, self.function(b))
            for i, b in reversed(list(enumerate(branches)))})  # the first of a name wins
        self.late.append(names)  # the functions' names, bound once they exist
        found = self.fresh("m")
        lines.append(f"{indent}{'elif' if lines else 'if'} {value}.__class__ is tuple and "
                     f"({found} := {names}.get({value}[0])) is not None:")
        lines.append(f"{indent}    out.append({found}[0])")
        lines.append(f"{indent}    {found}[1](out, {value}[1])")
        fallback = self.constant("union_schema", branches)
        lines.append(f"{indent}else:")
        lines.append(f"{indent}    _write_data(out, {value}, {fallback}, _NAMED, '', _OPTIONS)")
        return lines

    def branch_name(self, branch: Any) -> str:
        """The name a union's branch goes by in fastavro's tuple notation."""
        if isinstance(branch, str):
            return branch  # a primitive, or a reference to a named type by its full name
        if branch["type"] in ("record", "error", "enum", "fixed"):
            return str(branch["name"])
        return str(branch["type"])

    def guard(self, branch: Any, value: str) -> str | None:
        """What fastavro's validation of a value of the branch's Python class checks
        beyond the class, or None."""
        kind = self.kind(branch)
        schema = self.resolve(branch)
        if kind == "int":
            return f"-2147483648 <= {value} <= 2147483647"
        if kind == "long":
            return f"-9223372036854775808 <= {value} <= 9223372036854775807"
        if kind == "enum":
            return f"{value} in {self.constant('symbols', frozenset(schema['symbols']))}"
        if kind == "fixed":
            return f"len({value}) == {int(schema['size'])}"
        return None

    def array(self, items: Any) -> str:
        function = self.fresh("array")
        body = self.inline(items, "x", "        ") or ["        pass"]
        self.sources.append("\n".join([
            f"def {function}(out, v):",
            "    if v:",
            "        _long(out, len(v))",
            "    for x in v:",
            *body,
            "    out.append(0)",
        ]))
        return function

    def map(self, values: Any) -> str:
        function = self.fresh("map")
        body = self.inline(values, "x", "        ") or ["        pass"]
        self.sources.append("\n".join([
            f"def {function}(out, v):",
            "    if v:",
            "        _long(out, len(v))",
            "    for k, x in v.items():",
            "        _string(out, k)",
            *body,
            "    out.append(0)",
        ]))
        return function


def compile_writer(schema: Any, named: dict[str, Any] | None = None) -> Writer:
    """A writer of `schema` (as fastavro's `parse_schema` or `load_schema` gives it);
    `named` is the named-types dict `parse_schema` filled for it."""
    compiler = _Compiler(dict(named or {}))
    top = compiler.function(schema)
    compiler.namespace["_NAMED"] = compiler.named
    source = "\n\n".join(compiler.sources) + "\n"
    namespace = compiler.namespace
    exec(compile_source(source, "<avro writer>"), namespace)
    for table in compiler.late:
        namespace[table] = {k: (i, namespace[f]) for k, (i, f) in namespace[table].items()}
    writer: Writer = namespace[top]
    return writer
