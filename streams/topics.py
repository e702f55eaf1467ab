"""The topic contract: names, partitions, keys and configs of the core topics.

All topics are keyed by `thread_id` and share one partition count, so one
thread's commands, events, dispatches and live output live in partitions with
the same number and one processor instance owns all of a thread.

Pure data, read from `Settings`: the Kafka runtime creates and checks the topics
(`streams.kafka.topics.ensure_topics`), and tests and docs read the contract here.
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.config import Settings

__all__ = ["TopicSpec", "topic_specs"]


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic as the contract declares it: name, partitions, replicas, configs."""

    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str]


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """The core topics as the contract declares them for `settings`."""
    t = settings.topics
    durable = str(settings.durable_compaction_lag_ms)
    stream = str(settings.stream_retention_ms)
    # Compacted: the newest record per thread is kept forever; nothing younger than
    # min.compaction.lag.ms is compacted, so that window replays in full.
    base = {"cleanup.policy": "compact", "min.compaction.lag.ms": durable}
    specs = {
        t.commands: base,
        t.events: base,
        t.dispatch: base,
        t.dead_letter: base,
        # The table's changelog: only the newest state per thread matters, so it
        # compacts eagerly and a restore reads little more than one record a thread.
        t.threads: {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                    "segment.ms": str(3_600_000)},
        # The stored history: one key per message (thread_id/seq), so compaction keeps
        # every message and only drops superseded versions (a user message is
        # rewritten once, when its run ends) and deleted threads' tombstoned records.
        t.messages: base,
        # Live output: compacted *and* deleted after the replay window, so deltas
        # are transient (about 30 min) while the final answer lives in events.
        t.stream: {
            "cleanup.policy": "compact,delete",
            "min.compaction.lag.ms": stream,
            "retention.ms": stream,
            "segment.ms": str(max(60_000, settings.stream_retention_ms // 3)),
        },
    }
    isr = "2" if settings.replication_factor >= 3 else "1"
    return [
        TopicSpec(name, settings.partitions, settings.replication_factor,
                  {**cfg, "min.insync.replicas": isr})
        for name, cfg in specs.items()
    ]
