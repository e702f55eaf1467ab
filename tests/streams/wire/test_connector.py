"""The connector topics' bytes: a public contract, pinned byte for byte.

The expected bytes were written by the connector's earlier codec of its own
(`streams/connectors/codec.py`, fastavro's schemaless_writer); the shared binding
and writer must reproduce them, and read them back.
"""

from __future__ import annotations

import pytest

from streams.connectors.audit import AuditKind, ConnectorAudit
from streams.connectors.outbox import ChatOutbox, OutboxEntry, OutboxKind, OutboxStatus
from streams.wire import DecodeError
from streams.wire.connector import decode_audit, decode_outbox, encode_audit, encode_outbox

THREAD = "slack:T1:C1:1.0"
OUTBOX = ChatOutbox(THREAD, (OutboxEntry(
    "o1", OutboxKind.CHAT_POST, "answer", "run-1", "C1", "1.0", None, None, "héllo",
    OutboxStatus.FAILED, 2, 17, "1.2", None, True, 5, 9),), 9)
OUTBOX_BYTES = bytes.fromhex(
    "c3012856ae3becb29f261e736c61636b3a54313a43313a312e3002046f31000c616e737765720a72756e2d31"
    "0443310206312e3000000c68c3a96c6c6f060402220206312e3200010a120012")
AUDIT = ConnectorAudit("a1", THREAD, AuditKind.CHAT_CALL, "o1", "c1", '{"ok": true}', 5)
AUDIT_BYTES = bytes.fromhex(
    "c301ce236467bb45f8be0461311e736c61636b3a54313a43313a312e300202046f31046331187b226f6b22"
    "3a20747275657d0a")


def test_connector_records_keep_their_bytes() -> None:
    """Shows outbox and audit records encode to the pinned bytes and decode from them back to the same."""
    assert encode_outbox(OUTBOX) == OUTBOX_BYTES
    assert decode_outbox(OUTBOX_BYTES) == OUTBOX
    assert encode_audit(AUDIT) == AUDIT_BYTES
    assert decode_audit(AUDIT_BYTES) == AUDIT


@pytest.mark.parametrize("data", [b"", OUTBOX_BYTES[:10], OUTBOX_BYTES + b"\x00", AUDIT_BYTES,
                                  OUTBOX_BYTES[:-4], b"\x00\x00\x00\x00\x01" + OUTBOX_BYTES[10:]])
def test_anything_else_is_a_decode_error(data: bytes) -> None:
    """Shows empty, truncated, padded, other-schema or other-header bytes are a DecodeError, not an outbox."""
    with pytest.raises(DecodeError):
        decode_outbox(data)
