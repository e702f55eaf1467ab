"""The Avro contract on disk: `schemas/`, its retired versions, and fingerprints.

`schemas/` holds one `.avsc` file per named type, `<fullname>.avsc`, and one
top-level record per topic (`TOP_LEVEL_SCHEMAS`); `schemas/history/` the earlier
versions of top-level schemas records on the topics may have been written with;
`schemas/connectors/` the connector's own topics (`CONNECTOR_SCHEMAS`), kept in
their own folder so the core's schema tests, which own `schemas/*.avsc`, are
unaffected. The tables below are loaded once from those files: they are the
build's contract, the same for every role, not configuration.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro.schema import fingerprint, load_schema, parse_schema, to_parsing_canonical_form
from fastavro.types import Schema

from streams.wire.reader import Reader, compile_reader
from streams.wire.writer import Writer, compile_writer

__all__ = [
    "CONNECTOR_SCHEMAS",
    "CONNECTOR_SCHEMA_DIR",
    "HISTORY_DIR",
    "SCHEMA_DIR",
    "TOP_LEVEL_SCHEMAS",
    "TopLevel",
    "load_top_level",
    "retired",
    "retired_schemas",
    "schema_fingerprint",
    "schema_registry",
]

SCHEMA_DIR = Path(__file__).resolve().parent.parent.parent / "schemas"
HISTORY_DIR = SCHEMA_DIR / "history"
CONNECTOR_SCHEMA_DIR = SCHEMA_DIR / "connectors"
TOP_LEVEL_SCHEMAS = (  # one per topic, in the order `streams.wire.codec` unpacks them
    "threadline.CommandEnvelope",
    "threadline.EventEnvelope",
    "threadline.Dispatch",
    "threadline.StreamEnvelope",
    "threadline.DeadLetter",
    "threadline.ThreadState",  # the threads topic: the processor's table changelog
    "threadline.MessageRecord",  # the messages topic: the stored history
)
CONNECTOR_SCHEMAS = ("threadline.ChatOutbox", "threadline.ConnectorAudit")


def schema_fingerprint(schema: Schema) -> bytes:
    """The 8 bytes of the single-object header: CRC-64-AVRO of the canonical form.

    fastavro gives the fingerprint as hex of the little-endian bytes, which is
    the order the spec puts on the wire (checked against the spec's test vectors).
    """
    canonical = to_parsing_canonical_form(parse_schema(schema))
    return bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


@dataclass(frozen=True, slots=True)
class TopLevel:
    """A top-level schema of this build, parsed once, with its compiled reader and writer."""

    name: str
    parsed: Schema
    fingerprint: bytes
    named_types: dict[str, Any]  # fastavro's named schemas of `parsed`, for write_data
    reader: Reader  # compiled from `parsed`: records written with this very schema
    writer: Writer  # compiled from `parsed`: fastavro's bytes, about half its CPU

    @property
    def json(self) -> dict[str, Any]:
        """The schema with every named type inlined, without fastavro's own keys."""
        assert isinstance(self.parsed, dict)
        return {k: v for k, v in self.parsed.items() if not k.startswith("__")}


def load_top_level(name: str, directory: Path = SCHEMA_DIR) -> TopLevel:
    """The top-level schema `<directory>/<name>.avsc`, its named types resolved from the folder."""
    parsed = load_schema(str(directory / f"{name}.avsc"))
    named_types: dict[str, Any] = {}
    parse_schema(parsed, named_types)
    return TopLevel(name, parsed, schema_fingerprint(parsed), named_types,
                    compile_reader(parsed, named_types), compile_writer(parsed, named_types))


def schema_registry(directory: Path = SCHEMA_DIR) -> dict[bytes, dict[str, Any]]:
    """{fingerprint: schema} of the top-level schemas in `directory`, named types inlined."""
    loaded = (load_top_level(name, directory) for name in TOP_LEVEL_SCHEMAS)
    return {s.fingerprint: s.json for s in loaded}


def retired_schemas(directory: Path = HISTORY_DIR) -> dict[bytes, tuple[str, Schema]]:
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


CURRENT = {name: load_top_level(name) for name in TOP_LEVEL_SCHEMAS}
BY_FINGERPRINT = {s.fingerprint: s for s in CURRENT.values()}
CONNECTOR = {name: load_top_level(name, CONNECTOR_SCHEMA_DIR) for name in CONNECTOR_SCHEMAS}


@functools.cache
def retired() -> dict[bytes, tuple[str, Schema]]:
    """`retired_schemas()`, read once, when a record of an unknown fingerprint first
    comes: most roles never meet one, and reading them took 26 ms of every start."""
    return retired_schemas()
