"""Reading the transactional topics after a run, for the audit.

Each topic is read from the start to its end, partition by partition, once with
`read_committed` (what every reader of the contract sees) and once with
`read_uncommitted` (which also shows the records of aborted transactions), and
decoded into the plain data `chaos.topic_audit` checks.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from chaos.topic_audit import (
    HistoryRecord,
    StateRecord,
    TopicReads,
    TopicRecord,
    dead_letter_identities,
    dispatch_identities,
    event_identities,
    message_identities,
)
from streams.config import Settings
from streams.core.domain import StepRecorded
from streams.core.history import parse_message_key
from streams.wire import Codec, DecodeError

__all__ = ["Raw", "read_topic", "topic_reads"]


@dataclass(frozen=True, slots=True)
class Raw:
    """One record as read from a topic: partition, offset, key and value."""
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def read_topic(settings: Settings, topic: str, committed: bool = True,
               timeout: float = 60.0) -> list[Raw]:
    """Every record of `topic`, partition by partition, to its end now."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"audit-{uuid.uuid4()}",
                         "isolation.level": "read_committed" if committed else "read_uncommitted",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "log_level": 0})
    records: list[Raw] = []
    try:
        partitions = range(settings.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        open_partitions = set(partitions)
        deadline = time.monotonic() + timeout
        while open_partitions and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(msg.partition() or 0)
                    continue
                records.append(Raw(msg.partition() or 0, msg.offset() or 0, msg.key(), msg.value()))
        if open_partitions:
            raise RuntimeError(f"{topic}: partitions {sorted(open_partitions)} not read to the end")
        return records
    finally:
        consumer.close()


def topic_reads(settings: Settings) -> TopicReads:
    """The transactional topics, committed and uncommitted, decoded."""
    topics = settings.topics
    names = {"events": topics.events, "dispatch": topics.dispatch, "threads": topics.threads,
             "messages": topics.messages, "dead-letter": topics.dead_letter}
    reads = TopicReads()
    codec = Codec.from_settings(settings)  # the roles' format (THREADLINE_SCHEMA_REGISTRY_URL)
    for committed in (True, False):
        for short, topic in names.items():
            for raw in read_topic(settings, topic, committed):
                record = _decode(codec, short, raw, reads if committed else None)
                if record is not None:
                    (reads.committed if committed else reads.uncommitted).append(record)
    return reads


def _decode(codec: Codec, topic: str, raw: Raw, reads: TopicReads | None) -> TopicRecord | None:
    """The record's identities; with `reads` (a committed record) also what the
    history and state checks need. None for what does not decode (the answers
    audit counts dead letters; garbage is not ours to identify)."""
    key, value = raw.key or b"", raw.value
    try:
        if topic == "events" and value is not None:
            meta, event = codec.decode_event(value)
            if reads is not None:
                reads.events.append((meta.thread_id, event))
                if isinstance(event, StepRecorded):  # when the processor decided it
                    reads.step_decided_ms[f"{event.run_id}:{event.entry.step}"] = \
                        meta.produced_at_ms
            return TopicRecord(topic, raw.partition, raw.offset,
                               event_identities(meta.envelope_id, event), repr(event))
        if topic == "dispatch" and value is not None:
            meta, dispatch = codec.decode_dispatch(value)
            return TopicRecord(topic, raw.partition, raw.offset,
                               dispatch_identities(meta.envelope_id, meta.thread_id, dispatch),
                               f"dispatch of {dispatch.run_id} attempt {dispatch.attempt}")
        if topic == "messages":
            thread_id, seq = parse_message_key(key)
            if value is None:  # a tombstone
                if reads is not None:
                    reads.history.append(HistoryRecord(thread_id, seq, raw.partition, raw.offset,
                                                       None))
                return None
            meta, message = codec.decode_message(value)
            if reads is not None:
                reads.history.append(HistoryRecord(thread_id, seq, raw.partition, raw.offset,
                                                   message))
            return TopicRecord(topic, raw.partition, raw.offset,
                               message_identities(meta.envelope_id, key, thread_id, message),
                               f"{key.decode(errors='replace')} {message.run_status}")
        if topic == "threads":
            state = codec.decode_state(value) if value is not None else None
            if reads is not None:
                reads.states.append(StateRecord(key.decode(errors="replace"), raw.partition,
                                                raw.offset, state))
            return TopicRecord(topic, raw.partition, raw.offset, ())
        if topic == "dead-letter" and value is not None:
            dead = codec.decode_dead_letter(value)
            return TopicRecord(topic, raw.partition, raw.offset, dead_letter_identities(dead),
                               f"dead letter: {dead.reason}")
    except (DecodeError, ValueError):
        return None
    return None
