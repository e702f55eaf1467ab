"""The connector's audit record: who did what, when, with which ids.

Pure data; its bytes are `streams.wire.connector`'s (`schemas/connectors/`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["AuditKind", "ConnectorAudit"]


class AuditKind(StrEnum):
    """What an audit record attests (the symbols of `threadline.AuditKind`)."""

    INBOUND_EVENT = "inbound_event"  # authorizes queuing a turn: written before it
    CHAT_CALL = "chat_call"  # a chat call was made: written after, never blocking
    WEBHOOK_CALL = "webhook_call"
    ADOPTED = "adopted"  # reconciliation found a message posted earlier


@dataclass(frozen=True, slots=True)
class ConnectorAudit:
    """A record of the connector audit topic (`threadline.ConnectorAudit`)."""

    audit_id: str
    thread_id: str
    kind: AuditKind
    outbox_id: str | None
    instance_id: str
    detail_json: str
    at_ms: int
