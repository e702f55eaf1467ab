"""Topic management: create the declared topics idempotently and check existing ones.

The declarations are the contract in `streams.topics`; this module talks to the
brokers (admin client) to make them true, and reads the record size limit.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from streams.config import Settings
from streams.kafka.clients import librdkafka_config
from streams.topics import TopicSpec, topic_specs

__all__ = ["TopicMismatch", "ensure_specs", "ensure_topics", "record_limit"]

# librdkafka's own cap on a produced message (message.max.bytes), and room left under
# the broker's cap for the record batch header around a single record.
PRODUCER_MAX_BYTES = 1_000_000
_BATCH_OVERHEAD = 512


class TopicMismatch(RuntimeError):
    """An existing topic disagrees with the declared contract."""


def _admin(settings: Settings) -> AdminClient:
    return AdminClient(librdkafka_config(settings, log_level=0))


def ensure_topics(settings: Settings, timeout_s: float = 30.0) -> list[TopicSpec]:
    """Create missing topics; raise TopicMismatch if an existing one disagrees."""
    return ensure_specs(settings, topic_specs(settings), timeout_s)


def ensure_specs(settings: Settings, specs: list[TopicSpec], timeout_s: float = 30.0) -> list[TopicSpec]:
    """Create the missing topics of `specs`, check the existing ones against them,
    and return once every partition has a serving leader."""
    admin = _admin(settings)
    existing = admin.list_topics(timeout=timeout_s).topics
    missing = [s for s in specs if s.name not in existing]
    deadline = time.monotonic() + timeout_s
    while missing:
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, config=s.config) for s in missing],
            operation_timeout=timeout_s,
        )
        again = []
        for spec, fut in zip(missing, futures.values(), strict=True):
            try:
                fut.result()
            except Exception as exc:  # a racing creator is fine
                if "TOPIC_ALREADY_EXISTS" in str(exc):
                    continue
                if not _transient(exc) or time.monotonic() > deadline:
                    raise
                again.append(spec)  # e.g. a connection to a broker dropped under load
        missing = again
        if missing:
            time.sleep(0.5)
    _verify(admin, specs, timeout_s, settings)
    return specs


def record_limit(settings: Settings, timeout_s: float = 30.0) -> int:
    """The largest record (key and value) that every core topic accepts: the smallest
    `max.message.bytes` among them, the producer's own cap, less batch overhead."""
    admin = _admin(settings)
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in settings.topics.all()]
    limit = PRODUCER_MAX_BYTES
    for future in admin.describe_configs(resources, request_timeout=timeout_s).values():
        entry = future.result(timeout=timeout_s).get("max.message.bytes")
        if entry is not None and entry.value is not None:
            limit = min(limit, int(entry.value))
    return limit - _BATCH_OVERHEAD


def _transient(exc: Exception) -> bool:
    """A creation that failed on the way (the connection, not the request): retry it."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and (err.retriable() or err.code() in (
        KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT, KafkaError._TIMED_OUT))


def _cleanup_policy(admin: AdminClient, topic: str, deadline: float) -> str:
    # A broker that has not yet heard of a new topic answers UNKNOWN_TOPIC_OR_PART.
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    while True:
        try:
            value: str = admin.describe_configs([resource])[resource].result()["cleanup.policy"].value
            return value
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _verify(admin: AdminClient, specs: list[TopicSpec], timeout_s: float, settings: Settings) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        topics = admin.list_topics(timeout=timeout_s).topics
        if all(s.name in topics and not topics[s.name].error for s in specs):
            break
        if time.monotonic() > deadline:
            raise TopicMismatch("topics did not appear in metadata in time")
        time.sleep(0.1)
    problems = []
    for s in specs:
        n = len(topics[s.name].partitions)
        if n != s.partitions:
            problems.append(f"{s.name}: has {n} partitions, the contract says {s.partitions}")
    for spec in specs:
        actual = _cleanup_policy(admin, spec.name, deadline)
        if set(actual.split(",")) != set(spec.config["cleanup.policy"].split(",")):
            problems.append(f"{spec.name}: cleanup.policy={actual}, the contract says "
                            f"{spec.config['cleanup.policy']}")
    if problems:
        raise TopicMismatch("existing topics disagree with the contract:\n  " + "\n  ".join(problems))
    _wait_until_served(settings, specs, deadline)


def _wait_until_served(settings: Settings, specs: list[TopicSpec], deadline: float) -> None:
    """Wait until every partition's leader has created its log. Metadata shows a new
    topic before that; a produce in the gap fails and, seen on a loaded machine,
    librdkafka's idempotent producer can then take the retry for a duplicate and
    report success for records never written."""
    probe = Consumer(librdkafka_config(settings, **{"group.id": "threadline-topics", "log_level": 0}))
    try:
        pending = [TopicPartition(s.name, p) for s in specs for p in range(s.partitions)]
        while pending:
            waiting = []
            for tp in pending:
                try:
                    probe.get_watermark_offsets(tp, timeout=5)
                except KafkaException:
                    waiting.append(tp)
            if waiting and time.monotonic() > deadline:
                raise TopicMismatch(f"{len(waiting)} partitions have no serving leader, e.g. {waiting[0]}")
            pending = waiting
            if pending:
                time.sleep(0.2)
    finally:
        probe.close()
