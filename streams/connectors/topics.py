"""The connector's topics, beside the core contract and on the same terms.

    {prefix}outbox           compacted, keyed by thread_id: each thread's outbox
                             (`threadline.ChatOutbox`), written transactionally
    {prefix}connector-audit  time-retained, keyed by thread_id: audit records
                             (`threadline.ConnectorAudit`)

Both have the contract's partition count, so a thread's outbox lives in the
partition with the number of its events partition, and the connector instance
that owns the events partition owns the outbox partition too.
"""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from streams.config import Settings
from streams.topics import TopicMismatch, TopicSpec, ensure_topics

__all__ = ["audit_topic", "connector_topic_specs", "ensure_connector_topics", "outbox_topic"]


def outbox_topic(settings: Settings) -> str:
    return f"{settings.topic_prefix}outbox"


def audit_topic(settings: Settings) -> str:
    return f"{settings.topic_prefix}connector-audit"


def connector_topic_specs(settings: Settings, audit_retention_ms: int) -> list[TopicSpec]:
    isr = "2" if settings.replication_factor >= 3 else "1"
    outbox = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
              "segment.ms": str(3_600_000), "min.insync.replicas": isr}
    audit = {"cleanup.policy": "delete", "retention.ms": str(audit_retention_ms),
             "min.insync.replicas": isr}
    return [
        TopicSpec(outbox_topic(settings), settings.partitions, settings.replication_factor, outbox),
        TopicSpec(audit_topic(settings), settings.partitions, settings.replication_factor, audit),
    ]


def ensure_connector_topics(settings: Settings, audit_retention_ms: int,
                            timeout_s: float = 30.0) -> list[TopicSpec]:
    """The core topics (`streams.topics.ensure_topics`), then the connector's;
    TopicMismatch if an existing one has another partition count."""
    ensure_topics(settings, timeout_s)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap, "log_level": 0})
    specs = connector_topic_specs(settings, audit_retention_ms)
    existing = admin.list_topics(timeout=timeout_s).topics
    missing = [s for s in specs if s.name not in existing]
    if missing:
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, config=s.config) for s in missing],
            operation_timeout=timeout_s)
        for future in futures.values():
            try:
                future.result()
            except Exception as exc:  # a racing creator is fine
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
    deadline = time.monotonic() + timeout_s
    while True:
        topics = admin.list_topics(timeout=timeout_s).topics
        if all(s.name in topics and not topics[s.name].error for s in specs):
            break
        if time.monotonic() > deadline:
            raise TopicMismatch("connector topics did not appear in metadata in time")
        time.sleep(0.1)
    for s in specs:
        count = len(topics[s.name].partitions)
        if count != s.partitions:
            raise TopicMismatch(f"{s.name}: has {count} partitions, the contract says {s.partitions}")
    return specs
