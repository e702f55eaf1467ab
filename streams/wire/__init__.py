"""All Avro bytes of Threadline; nothing else touches them.

The contract is `schemas/` (`streams.wire.schemas`). Records mirror the
dataclasses of `streams.core.domain`, `streams.core.records` and `streams.connectors` field
for field; the mapping is derived from the dataclass fields once per class
(`binding`), and records of this build's schemas are read by a reader compiled
per schema (`reader`). Two wire formats, told apart by the first byte (`frame`):
Avro single-object encoding, the default, and the Confluent format when a schema
registry (`registry`) is configured.

Modules, one concept each:

    errors      SerializationError, DecodeError (to the dead-letter topic), RegistryError
    envelope    EnvelopeMeta, the envelope fields of a record, and new_meta; the
                stream records' payload header
    binding     dataclass <-> Avro record, compiled per class
    reader      Avro binary decoding compiled per schema
    schemas     schemas/ and its retired versions, loaded once; fingerprints
    frame       the two formats' headers; writing and reading the body
    registry    ConfluentRegistry, the schema registry client
    codec       Codec: the core topics' records; one per role, `Codec.from_settings`
    connector   the connector's outbox and audit records (always single-object)

No instance is shared: each role builds its `Codec` from its settings once and
passes it down, so the registry setting reaches every role.
"""

from streams.wire.codec import Codec
from streams.wire.envelope import (
    LIFECYCLE_HEADER,
    PAYLOAD_HEADER,
    REPLY_HEADER,
    EnvelopeMeta,
    header_value,
    new_meta,
    payload_header,
    payload_named,
    stream_headers,
)
from streams.wire.errors import DecodeError, RegistryError, SerializationError
from streams.wire.registry import ConfluentRegistry
from streams.wire.schemas import SCHEMA_DIR, TOP_LEVEL_SCHEMAS, schema_fingerprint, schema_registry

__all__ = [
    "LIFECYCLE_HEADER",
    "PAYLOAD_HEADER",
    "REPLY_HEADER",
    "SCHEMA_DIR",
    "TOP_LEVEL_SCHEMAS",
    "Codec",
    "ConfluentRegistry",
    "DecodeError",
    "EnvelopeMeta",
    "RegistryError",
    "SerializationError",
    "header_value",
    "new_meta",
    "payload_header",
    "payload_named",
    "schema_fingerprint",
    "schema_registry",
    "stream_headers",
]
