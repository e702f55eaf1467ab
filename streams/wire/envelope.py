"""The envelope fields of a topic record, apart from its payload."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

__all__ = ["EnvelopeMeta", "new_meta"]


@dataclass(frozen=True, slots=True)
class EnvelopeMeta:
    """The envelope fields every topic record but dead letters carries.

    `schema_version` is the version of the Threadline record contract the
    producer followed; the Avro schema itself is named by the wire header.
    """

    envelope_id: str
    thread_id: str
    tenant: str
    produced_at_ms: int
    traceparent: str | None = None
    tracestate: str | None = None
    schema_version: int = 1


def new_meta(
    thread_id: str,
    tenant: str,
    now_ms: int,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> EnvelopeMeta:
    """Envelope fields for a new record, with a fresh random envelope id."""
    return EnvelopeMeta(str(uuid.uuid4()), thread_id, tenant, now_ms, traceparent, tracestate)
