"""Counters of one connector process, served as JSON at `GET /stats`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

__all__ = ["ConnectorStats"]


@dataclass
class ConnectorStats:
    """Thread-safe counters of the connector's inbound events and outbound calls."""
    inbound_accepted: int = 0  # events queued, then acknowledged
    inbound_ignored: int = 0  # verified but not a turn (bot messages, edits, other events)
    inbound_refused: int = 0  # bad signature or stale timestamp: 401
    inbound_failed: int = 0  # the Kafka write failed or was late: 503, the chat redelivers
    entries_planned: int = 0
    calls: int = 0  # chat and webhook calls made
    delivered: int = 0
    adopted: int = 0  # found by reconciliation instead of posted again
    reconciled_not_found: int = 0
    refused: int = 0  # failed for good
    retries: int = 0
    rate_limited: int = 0
    fenced: int = 0  # transactions refused for a stale generation: this instance was deposed
    not_sent: int = 0  # fenced calls whose lease ran out before the request left
    results_unrecorded: int = 0  # results of calls whose thread moved to another owner
    aborted: int = 0
    audit_failed: int = 0  # after-the-fact audit records that could not be written
    transactions: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1) -> None:
        """Add n to the named counter."""
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        """Every counter's current value, by name."""
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
