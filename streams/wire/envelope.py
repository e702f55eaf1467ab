"""The envelope fields of a topic record, apart from its payload."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["LIFECYCLE_HEADER", "PAYLOAD_HEADER", "REPLY_HEADER", "EnvelopeMeta", "header_value",
           "new_meta", "payload_header", "payload_named", "random_uuid", "stream_headers",
           "uuid4_text"]

# A stream record's payload type (its Avro record name, e.g. `TextDelta`), as a Kafka
# header: a reader that wants some kinds skips the others without decoding them.
# Optional: a record without it (older writers) is decoded to find out.
PAYLOAD_HEADER = "threadline-payload"
# On a stream record of a run's lifecycle (`RunLifecycle`): its event, e.g.
# `run_accepted`. A reader that wants only some of them (a gateway's feed: a run's
# start and end) skips the others undecoded. Optional, like PAYLOAD_HEADER.
LIFECYCLE_HEADER = "threadline-lifecycle"
# On a command: who waits for its decision (a gateway process's reply id). The
# processor copies it onto the events it decides from that command (and onto the
# commands a decision writes, a copy's parts), so a gateway decodes the decisions it
# waits for and skips the others' by their headers. Optional, like PAYLOAD_HEADER.
REPLY_HEADER = "threadline-reply-to"


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
    return EnvelopeMeta(random_uuid(), thread_id, tenant, now_ms, traceparent, tracestate)


# The version (4) and variant (RFC 4122) bits of a random UUID, and the bits they replace.
_UUID4_KEEP = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def random_uuid() -> str:
    """`str(uuid.uuid4())` in half the time: a worker makes one for every record it
    writes (issue #22)."""
    return uuid4_text(os.urandom(16))


def uuid4_text(raw: bytes) -> str:
    """`str(uuid.UUID(bytes=raw, version=4))`: the version 4 UUID made of 16 random bytes."""
    h = "%032x" % (int.from_bytes(raw) & _UUID4_KEEP | _UUID4_SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def payload_header(payload: object) -> tuple[str, bytes]:
    """The `PAYLOAD_HEADER` of a record carrying `payload` (its class is its Avro name)."""
    return PAYLOAD_HEADER, type(payload).__name__.encode()


def stream_headers(payload: object) -> list[tuple[str, bytes]]:
    """The headers of a stream record carrying `payload`: its `PAYLOAD_HEADER`, and a
    lifecycle record's `LIFECYCLE_HEADER`."""
    headers = [payload_header(payload)]
    event = getattr(payload, "event", None) if type(payload).__name__ == "RunLifecycle" else None
    if isinstance(event, str):
        headers.append((LIFECYCLE_HEADER, event.encode()))
    return headers


def payload_named(headers: object) -> bytes | None:
    """The payload type a record's headers name (pairs, as aiokafka and confluent-kafka
    give them), or None if they do not."""
    return header_value(headers, PAYLOAD_HEADER)


def header_value(headers: object, wanted: str) -> bytes | None:
    """The value of header `wanted` among a record's headers (pairs, as aiokafka and
    confluent-kafka give them), or None."""
    if headers:
        for name, value in headers:  # type: ignore[attr-defined]
            if name == wanted:
                return value if isinstance(value, bytes) else None
    return None
