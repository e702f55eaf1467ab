"""Avro bytes of the connector's own topics: the outbox and the audit log.

The schemas are `schemas/connectors/*.avsc`; the records bind to
`streams.connectors.outbox.ChatOutbox` and `streams.connectors.audit.ConnectorAudit`
through the same binding, reader and writer as the core's. The format is fixed
by the connector topics' public contract, Avro single-object encoding, whatever
the schema registry setting: so these are plain functions, with nothing for a
setting to choose.

Decoding raises `DecodeError` for bytes that are not a record of the expected kind.
"""

from __future__ import annotations

from typing import Any

from streams.connectors.audit import ConnectorAudit
from streams.connectors.outbox import ChatOutbox
from streams.wire.binding import Binding, binding_of
from streams.wire.errors import DecodeError
from streams.wire.frame import SINGLE_OBJECT_HEADER_LEN, read_body, single_object_header, write_record
from streams.wire.schemas import CONNECTOR, TopLevel

__all__ = ["decode_audit", "decode_outbox", "encode_audit", "encode_outbox"]

_OUTBOX = CONNECTOR["threadline.ChatOutbox"]
_AUDIT = CONNECTOR["threadline.ConnectorAudit"]
_OUTBOX_BINDING = binding_of(ChatOutbox)
_AUDIT_BINDING = binding_of(ConnectorAudit)


def _write(schema: TopLevel, binding: Binding, value: Any) -> bytes:
    return write_record(schema, single_object_header(schema), binding.to_avro(value))


def _read(schema: TopLevel, binding: Binding, data: bytes) -> Any:
    header = single_object_header(schema)
    if data[:SINGLE_OBJECT_HEADER_LEN] != header:
        raise DecodeError(
            f"not a {schema.name} record (header {data[:SINGLE_OBJECT_HEADER_LEN].hex()})")
    return read_body(schema, schema.parsed, data, SINGLE_OBJECT_HEADER_LEN, binding.from_avro)


def encode_outbox(outbox: ChatOutbox) -> bytes:
    """A record of the outbox topic: one thread's whole outbox."""
    return _write(_OUTBOX, _OUTBOX_BINDING, outbox)


def decode_outbox(data: bytes) -> ChatOutbox:
    """A record of the outbox topic; DecodeError if malformed."""
    outbox: ChatOutbox = _read(_OUTBOX, _OUTBOX_BINDING, data)
    return outbox


def encode_audit(audit: ConnectorAudit) -> bytes:
    """A record of the connector audit topic."""
    return _write(_AUDIT, _AUDIT_BINDING, audit)


def decode_audit(data: bytes) -> ConnectorAudit:
    """A record of the connector audit topic; DecodeError if malformed."""
    audit: ConnectorAudit = _read(_AUDIT, _AUDIT_BINDING, data)
    return audit
