"""Avro bytes of the connector's own topics: the outbox and the audit log.

The schemas are `schemas/connectors/*.avsc` (named types of namespace
`threadline`, beside the core contract but in their own folder, so the core's
schema tests, which own `schemas/*.avsc`, are unaffected). The wire format is
the core's default, Avro single-object encoding: `C3 01`, the 8-byte CRC-64-AVRO
fingerprint of the writer schema (`streams.serialization.schema_fingerprint`),
then the binary body.

Decoding raises `streams.serialization.DecodeError` for bytes that are not a
record of the expected kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from io import BytesIO
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import load_schema
from fastavro.types import Schema

from streams.connectors.outbox import ChatOutbox, OutboxEntry, OutboxKind, OutboxStatus
from streams.serialization import SCHEMA_DIR, DecodeError, schema_fingerprint

__all__ = [
    "CONNECTOR_SCHEMA_DIR",
    "AuditKind",
    "ConnectorAudit",
    "decode_audit",
    "decode_outbox",
    "encode_audit",
    "encode_outbox",
]

CONNECTOR_SCHEMA_DIR = SCHEMA_DIR / "connectors"
_MARKER = b"\xc3\x01"
_HEADER_LEN = 10


class AuditKind(StrEnum):
    """What an audit record attests (the symbols of `threadline.AuditKind`)."""

    INBOUND_EVENT = "inbound_event"  # authorizes queuing a turn: written before it
    CHAT_CALL = "chat_call"  # a chat call was made: written after, never blocking
    WEBHOOK_CALL = "webhook_call"
    ADOPTED = "adopted"  # reconciliation found a message posted earlier


@dataclass(frozen=True, slots=True)
class ConnectorAudit:
    audit_id: str
    thread_id: str
    kind: AuditKind
    outbox_id: str | None
    instance_id: str
    detail_json: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class _Schema:
    parsed: Schema
    header: bytes


def _load(name: str) -> _Schema:
    parsed = load_schema(str(CONNECTOR_SCHEMA_DIR / f"{name}.avsc"))
    return _Schema(parsed, _MARKER + schema_fingerprint(parsed))


_OUTBOX = _load("threadline.ChatOutbox")
_AUDIT = _load("threadline.ConnectorAudit")


def _write(schema: _Schema, record: dict[str, Any]) -> bytes:
    out = BytesIO()
    out.write(schema.header)
    schemaless_writer(out, schema.parsed, record)
    return out.getvalue()


def _read(schema: _Schema, data: bytes, what: str) -> dict[str, Any]:
    if data[:_HEADER_LEN] != schema.header:
        raise DecodeError(f"not a {what} record (header {data[:_HEADER_LEN].hex()})")
    body = BytesIO(data)
    body.seek(_HEADER_LEN)
    try:
        record = schemaless_reader(body, schema.parsed, None)
    except Exception as exc:  # whatever malformed bytes make fastavro raise
        raise DecodeError(f"malformed {what} body: {type(exc).__name__}: {exc}") from exc
    if body.tell() != len(data):
        raise DecodeError(f"{len(data) - body.tell()} trailing bytes after the {what} body")
    assert isinstance(record, dict)
    return record


def _entry_to_avro(e: OutboxEntry) -> dict[str, Any]:
    return {
        "outbox_id": e.outbox_id, "kind": e.kind.value, "role": e.role, "trigger": e.trigger,
        "channel": e.channel, "thread_ts": e.thread_ts, "target_outbox_id": e.target_outbox_id,
        "target_ts": e.target_ts, "text": e.text, "status": e.status.value,
        "attempts": e.attempts, "fenced_at_ms": e.fenced_at_ms, "result_ts": e.result_ts,
        "error": e.error, "adopted": e.adopted, "created_at_ms": e.created_at_ms,
        "updated_at_ms": e.updated_at_ms,
    }


def _entry_from_avro(r: dict[str, Any]) -> OutboxEntry:
    return OutboxEntry(**{**r, "kind": OutboxKind(r["kind"]), "status": OutboxStatus(r["status"])})


def encode_outbox(outbox: ChatOutbox) -> bytes:
    """A record of the outbox topic: one thread's whole outbox."""
    return _write(_OUTBOX, {"thread_id": outbox.thread_id,
                            "entries": [_entry_to_avro(e) for e in outbox.entries],
                            "updated_at_ms": outbox.updated_at_ms})


def decode_outbox(data: bytes) -> ChatOutbox:
    r = _read(_OUTBOX, data, "threadline.ChatOutbox")
    try:
        entries = tuple(_entry_from_avro(e) for e in r["entries"])
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"malformed outbox entry: {exc}") from exc
    return ChatOutbox(r["thread_id"], entries, r["updated_at_ms"])


def encode_audit(audit: ConnectorAudit) -> bytes:
    """A record of the connector audit topic."""
    return _write(_AUDIT, {
        "audit_id": audit.audit_id, "thread_id": audit.thread_id, "kind": audit.kind.value,
        "outbox_id": audit.outbox_id, "instance_id": audit.instance_id,
        "detail_json": audit.detail_json, "at_ms": audit.at_ms,
    })


def decode_audit(data: bytes) -> ConnectorAudit:
    r = _read(_AUDIT, data, "threadline.ConnectorAudit")
    return ConnectorAudit(**{**r, "kind": AuditKind(r["kind"])})
