"""What the compiled Avro reader and writer share: walking a parsed schema to the
name of a generated function for each of its types (`streams.wire.reader`,
`streams.wire.writer`), and compiling the generated source (`compile_source`).

Every role compiles the same sources at start-up, about 80 of them (each schema's
reader and writer, each record class's binding): Python's `compile` of them took
60 ms of a role's 450-700 ms import, on the path of every restart. So the code
objects are kept as Python keeps a module's, in `__pycache__` beside this module
(`sys.pycache_prefix` and `sys.dont_write_bytecode` honoured), marshalled, under a
name that is the digest of the source, its file name and the interpreter's cache
tag: a source that changes is a new name, so an entry is never stale, only unused
(one of a few KiB for each schema version and record class a role ever compiled).
Writes are atomic (a temporary file renamed); an entry that cannot be read or
written is compiled and the error ignored, as CPython does with a `.pyc`.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import CodeType
from typing import Any, ClassVar

__all__ = ["SchemaCompiler", "compile_source"]


def _cache_folder() -> Path:
    here = Path(__file__).resolve().parent
    prefix = sys.pycache_prefix
    if prefix:  # as importlib places a .pyc under the prefix: the source's folder, mirrored
        return Path(prefix) / here.relative_to(here.anchor)
    return here / "__pycache__"


def compile_source(source: str, filename: str) -> CodeType:
    """`compile(source, filename, "exec")`, from the cache when it holds it (see the module)."""
    tag = sys.implementation.cache_tag
    if tag is None:  # an interpreter without bytecode caching
        return compile(source, filename, "exec")
    digest = hashlib.sha256(f"{tag}\0{filename}\0{source}".encode()).hexdigest()[:32]
    path = _cache_folder() / f"avro-{tag}-{digest}.bin"
    with contextlib.suppress(OSError, ValueError, EOFError, TypeError):
        code = marshal.loads(path.read_bytes())
        if isinstance(code, CodeType):
            return code
    code = compile(source, filename, "exec")
    if not sys.dont_write_bytecode:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".avro-")
            try:
                # Readable by all, as a .pyc is: an image writes these at build, as root,
                # for roles that run as another user (mkstemp's own mode is 0600).
                os.fchmod(fd, 0o644)
                with os.fdopen(fd, "wb") as out:
                    out.write(marshal.dumps(code))
                os.replace(temporary, path)
            except OSError:
                os.unlink(temporary)
                raise
    return code


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
