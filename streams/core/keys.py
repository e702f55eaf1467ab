"""Idempotency keys: what a key was first used for, for how long, and how many.

Pure, like `streams.core.thread`, which (with `streams.core.forks`) calls it. A key
is remembered with the fingerprint of what it was used for; a repeat with the same
fingerprint is a duplicate, with another a payload mismatch. The check expires
`Policy.idempotency_window_ms` after the key's first use, and the state keeps at
most `Policy.max_idempotency_keys` keys (oldest dropped first). What never runs
twice whatever its age (a message id, a regenerate's run) is answered from the
stored history instead (`Known`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from types import MappingProxyType

from streams.core.domain import IdempotencyRecord, Policy, RejectReason, ThreadState

__all__ = ["bounded_keys", "expired", "key_conflict", "payload_fingerprint",
           "regenerate_fingerprint"]


def payload_fingerprint(text: str) -> str:
    """SHA-256 hex digest of a message text, stored with its idempotency key."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def regenerate_fingerprint(message_id: str) -> str:
    """The fingerprint a regenerate's key is stored with: of the message it answers."""
    return payload_fingerprint(f"regenerate\x00{message_id}")


def expired(record: IdempotencyRecord, now_ms: int, policy: Policy) -> bool:
    """Whether the key-to-body check of `record` has expired at `now_ms`."""
    return now_ms - record.at_ms > policy.idempotency_window_ms


def key_conflict(state: ThreadState, key: str | None, fingerprint: str, now_ms: int,
                 policy: Policy) -> tuple[RejectReason, str, str] | None:
    """(reason, detail, the run the key started) if `key` was already used, or None."""
    record = state.idempotency.get(key) if key is not None else None
    if record is None or expired(record, now_ms, policy):
        return None
    if record.payload_fingerprint == fingerprint:
        return RejectReason.DUPLICATE, "idempotency key already used", record.run_id
    return (RejectReason.PAYLOAD_MISMATCH, "idempotency key already used with another payload",
            record.run_id)


def bounded_keys(keys: Mapping[str, IdempotencyRecord], key: str, record: IdempotencyRecord,
                 policy: Policy) -> Mapping[str, IdempotencyRecord]:
    """`keys` with `key` added, less the expired keys and the oldest beyond the count
    cap (insertion order is age order). A dropped key's message id still never runs
    twice: `Known.message_run_id` answers that from the stored history."""
    kept = {k: r for k, r in keys.items()
            if k != key and not expired(r, record.at_ms, policy)}
    kept[key] = record
    while len(kept) > max(policy.max_idempotency_keys, 1):
        del kept[next(iter(kept))]
    return MappingProxyType(kept)
