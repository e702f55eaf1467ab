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

from streams.config import Settings
from streams.kafka.topics import ensure_specs, ensure_topics
from streams.topics import TopicSpec

__all__ = ["audit_topic", "connector_topic_specs", "ensure_connector_topics", "outbox_topic"]


def outbox_topic(settings: Settings) -> str:
    """The compacted topic of each thread's outbox."""
    return f"{settings.topic_prefix}outbox"


def audit_topic(settings: Settings) -> str:
    """The topic that records inbound events and outbound calls, for audit."""
    return f"{settings.topic_prefix}connector-audit"


def connector_topic_specs(settings: Settings, audit_retention_ms: int) -> list[TopicSpec]:
    """The specs of the outbox and audit topics."""
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
                            stall_s: float | None = None) -> list[TopicSpec]:
    """The core topics (`streams.kafka.topics.ensure_topics`), then the connector's, on
    the same terms: TopicMismatch if an existing one disagrees, and only once every
    partition has a serving leader (a query in the gap answers NOT_LEADER)."""
    ensure_topics(settings, stall_s)
    return ensure_specs(settings, connector_topic_specs(settings, audit_retention_ms), stall_s)
