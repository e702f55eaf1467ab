"""Every derived id: the same inputs always name the same thing.

Pure (no clock, no randomness). These ids are on the wire and in store keys, so
each derivation and namespace is fixed forever; `tests/streams/test_ids.py` pins
known values. Chat addresses (`streams.connectors.ids`) stay with the connector:
they are a reversible mapping of Slack ids, not a hash.
"""

from __future__ import annotations

import hashlib
import uuid
from functools import lru_cache

__all__ = [
    "answer_message_id_for",
    "derived_envelope_id",
    "idempotent_message_id_for",
    "outbox_id_for",
    "regenerate_run_id_for",
    "run_id_for",
    "uuid5_text",
    "workflow_id_for",
]

# Fixed forever: changing it changes every derived run and message id.
_ID_NAMESPACE = uuid.UUID("d54544ca-b4dd-48dd-a9c2-e9e2b46811a5")
_ID_NAMESPACE_BYTES = _ID_NAMESPACE.bytes
# Fixed forever: changing it changes the message id of every idempotency key.
_KEY_NAMESPACE = uuid.UUID("5d0c7c1e-9b0e-4f57-a3a4-2c1f0f1f6a11")
# Fixed forever: changing it changes every outbox id (and so every idempotency key).
_OUTBOX_NAMESPACE = uuid.UUID("7f4f0a52-52a5-4b8e-9a6e-3f4bd3a1c0de")


def uuid5_text(sha1_digest: bytes) -> str:
    """`str(uuid.UUID(bytes=sha1_digest[:16], version=5))`, without building a UUID
    (a third of the cost of an id, which the processor makes several of per command)."""
    b = bytearray(sha1_digest[:16])
    b[6] = (b[6] & 0x0F) | 0x50  # version 5
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _uuid5(name: str) -> str:
    # uuid.uuid5 itself, but "surrogatepass" so that no string can make it raise.
    data = _ID_NAMESPACE_BYTES + name.encode("utf-8", "surrogatepass")
    return uuid5_text(hashlib.sha1(data, usedforsecurity=False).digest())


@lru_cache(maxsize=16_384)
def run_id_for(thread_id: str, message_id: str) -> str:
    """The run id a user message starts: the same message always maps to the same run."""
    # Length-prefixed so that ("a:b", "c") and ("a", "b:c") cannot collide.
    return _uuid5(f"run:{len(thread_id)}:{thread_id}:{message_id}")


def regenerate_run_id_for(thread_id: str, idempotency_key: str) -> str:
    """The run a regenerate with this idempotency key starts: one key, one run, so a
    regenerate sent twice answers once. Never a user message's run: another prefix."""
    return _uuid5(f"regenerate:{len(thread_id)}:{thread_id}:{idempotency_key}")


@lru_cache(maxsize=16_384)  # pure; decide, evolve and the lifecycle mirror ask in turn
def answer_message_id_for(run_id: str) -> str:
    """The message id of the assistant answer that completes `run_id`."""
    return _uuid5(f"answer:{run_id}")


def workflow_id_for(thread_id: str) -> str:
    """The reference API's workflow id: one durable workflow per thread."""
    return f"agent-{thread_id}"


def derived_envelope_id(parent: str, index: int) -> str:
    """The envelope id of the `index`-th record a decision on envelope `parent` writes,
    so a decision made again (after a crash) writes the same ids."""
    digest = hashlib.sha1(f"{parent}:{index}".encode(), usedforsecurity=False).digest()
    return uuid5_text(digest)


def idempotent_message_id_for(tenant: str, thread_id: str, idempotency_key: str) -> str:
    """The user message id of an idempotency key: the same key always names the same
    message, so the processor's duplicate rules answer a resend."""
    name = f"{len(tenant)}:{tenant}:{len(thread_id)}:{thread_id}:{idempotency_key}"
    return str(uuid.uuid5(_KEY_NAMESPACE, name))


def outbox_id_for(trigger: str, role: str) -> str:
    """The outbox id of the outbound message `role` caused by `trigger` (a run or message id)."""
    # Length-prefixed so that ("a:b", "c") and ("a", "b:c") cannot collide.
    return str(uuid.uuid5(_OUTBOX_NAMESPACE, f"{len(trigger)}:{trigger}:{role}"))
