"""What the compiled Avro reader and writer share: walking a parsed schema to the
name of a generated function for each of its types (`streams.wire.reader`,
`streams.wire.writer`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = ["SchemaCompiler"]


class SchemaCompiler:
    """Generates one function per type of a schema into `sources`; a subclass says
    how a named type, a union, an array and a map are read or written, and names the
    helper of each primitive (`primitives`)."""

    primitives: ClassVar[Mapping[str, str]] = {}

    def __init__(self, named: dict[str, Any], helpers: dict[str, Any]) -> None:
        self.named = named  # full name -> schema, as parse_schema records them
        self.functions: dict[str, str] = {}  # full name -> function name
        self.sources: list[str] = []
        self.namespace: dict[str, Any] = dict(helpers)
        self.counter = 0

    def fresh(self, stem: str) -> str:
        """A name no other generated function or constant has."""
        self.counter += 1
        return f"_{stem}{self.counter}"

    def constant(self, stem: str, value: Any) -> str:
        """The name under which the generated code sees `value`."""
        name = self.fresh(stem)
        self.namespace[name] = value
        return name

    def function(self, schema: Any) -> str:
        """The name of the generated function for `schema`."""
        if isinstance(schema, str):
            if schema in self.primitives:
                return self.primitives[schema]
            return self.named_function(schema)
        if isinstance(schema, list):
            return self.union_function(schema)
        kind = schema["type"]
        if kind in ("record", "error", "enum", "fixed"):
            self.named.setdefault(schema["name"], schema)
            return self.named_function(schema["name"])
        if kind == "array":
            return self.array(schema["items"])
        if kind == "map":
            return self.map(schema["values"])
        if kind in self.primitives:  # {"type": "string"}, logical types unused here
            if schema.get("logicalType"):
                raise NotImplementedError(f"logical type {schema['logicalType']}")
            return self.primitives[kind]
        raise NotImplementedError(f"Avro type {kind!r}")

    def named_function(self, name: str) -> str:
        """The function of the named type `name` (made once: types may recurse)."""
        raise NotImplementedError

    def union_function(self, branches: list[Any]) -> str:
        """The function of a union of `branches`."""
        raise NotImplementedError

    def array(self, items: Any) -> str:
        """The function of an array of `items`."""
        raise NotImplementedError

    def map(self, values: Any) -> str:
        """The function of a map of `values`."""
        raise NotImplementedError
