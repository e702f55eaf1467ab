"""Helpers for tests against the real broker: producers and readers of the topics
(role processes are `streams.testing.process`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from streams.config import Settings
from streams.core.domain import Command, Event, PostUserMessage, RunRejected
from streams.wire import Codec, new_meta, payload_header

CODEC = Codec()  # single-object records, as the roles write them without a registry

T = TypeVar("T")


def command_producer(settings: Settings) -> Producer:
    """An idempotent producer for the commands topic, partitioning keys as the Java client does."""
    return Producer({"bootstrap.servers": settings.bootstrap, "partitioner": "murmur2_random",
                     "enable.idempotence": True, "linger.ms": 2})


DELIVERY_ERRORS: list[str] = []


def _delivered(err: KafkaError | None, msg: Any) -> None:
    if err is not None:
        DELIVERY_ERRORS.append(f"{msg.topic()}[{msg.partition()}]: {err}")


def send_command(producer: Producer, settings: Settings, command: Command, tenant: str = "t") -> None:
    """Publish a command; a failed delivery is recorded in DELIVERY_ERRORS, which
    `flush_all` turns into a test failure, so a lost command is never blamed on
    the processor."""
    meta = new_meta(command.thread_id, tenant, int(time.time() * 1000))
    # Named as a worker names its reports: the processor lets a batch of reports
    # linger (`streams.processor.UNAWAITED`), and the tests' reports should too.
    producer.produce(settings.topics.commands, CODEC.encode_command(command, meta),
                     command.thread_id.encode(), on_delivery=_delivered,
                     headers=[payload_header(command)])


def send_marker(producer: Producer, settings: Settings, thread_id: str, tenant: str = "t") -> str:
    """A marker in `thread_id`'s partition of the commands: a post with no text,
    which the processor refuses (`RunRejected`, INVALID) and which changes nothing.
    Once its rejection is on `events`, every earlier command of that partition has
    been decided: "nothing more arrived before it" can be asserted, where a sleep
    would only hope so. Returns the marker's message id (see `marked`)."""
    marker = f"marker-{uuid.uuid4()}"
    send_command(producer, settings,
                 PostUserMessage(thread_id, tenant, marker, "", None, int(time.time() * 1000)), tenant)
    producer.flush(10)
    return marker


def marked(*markers: str) -> Callable[[list[Event]], bool]:
    """An `until` for the events topic: every marker's rejection is there."""
    wanted = set(markers)
    return lambda events: wanted <= {e.message_id for e in events if isinstance(e, RunRejected)}


def flush_all(producer: Producer, timeout: float = 60) -> None:
    """Flush the producer; fail the test if a command is undelivered or a delivery failed."""
    left = producer.flush(timeout)
    assert left == 0, f"{left} commands still undelivered after {timeout}s"
    assert not DELIVERY_ERRORS, DELIVERY_ERRORS[:5]


def read_topic(
    settings: Settings, topic: str, decode: Callable[[bytes], T], *,
    until: Callable[[list[T]], bool], timeout: float = 60.0, isolation: str = "read_committed",
) -> list[T]:
    """Read a whole topic from the start until `until(records)` holds (see read_messages)."""
    return read_messages(settings, topic, lambda msg: decode(msg.value() or b""), until=until,
                         timeout=timeout, isolation=isolation)


def read_messages(
    settings: Settings, topic: str, decode: Callable[[Message], T], *,
    until: Callable[[list[T]], bool], timeout: float = 60.0, isolation: str = "read_committed",
) -> list[T]:
    """`read_topic` with the whole consumed message (its partition and offset too) decoded.

    The wait is bounded by progress, not by the clock (a loaded machine is slow, not
    stuck): it fails once `timeout` seconds pass with no new record and `until` still
    false, instead of handing the caller a partial read to assert on."""
    consumer = Consumer({
        "bootstrap.servers": settings.bootstrap, "group.id": f"reader-{uuid.uuid4()}",
        "isolation.level": isolation, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "log_level": 3,
    })
    md = consumer.list_topics(topic, timeout=10)
    consumer.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
    records: list[T] = []
    since = time.monotonic()
    try:
        while True:
            for msg in consumer.consume(500, timeout=0.2):
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(error)
                    continue
                records.append(decode(msg))
                since = time.monotonic()
            if until(records):
                return records
            if time.monotonic() - since > timeout:
                raise AssertionError(f"{topic}: the awaited records are not there; {len(records)} "
                                     f"read, none new for {timeout}s")
    finally:
        consumer.close()


def keys_to_end(settings: Settings, topic: str) -> list[bytes]:
    """Every record key on `topic` now, as read_committed sees it, read to the end of
    each partition (so a count of them is exact, not "at least")."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"r-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True, "log_level": 3})
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    keys: list[bytes] = []
    at_end: set[int] = set()
    try:
        while len(at_end) < len(parts):
            for msg in consumer.consume(1000, timeout=1):
                error = msg.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    at_end.add(msg.partition() or 0)
                    continue
                keys.append(msg.key() or b"")
    finally:
        consumer.close()
    return keys
