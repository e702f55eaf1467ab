"""`gateway.kafka.SharedConsumer`: the read model and the command bus read through one
consumer, each only its own partitions, against the real broker. A reader that
changes its partitions leaves the other's position where it was, and a backlog on
one reader's partitions does not hold back the other's records."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from gateway.kafka import SharedConsumer, _known_position
from streams.config import Settings
from streams.kafka.clients import aiokafka_config
from streams.kafka.topics import ensure_topics

pytestmark = pytest.mark.kafka


async def _produce(settings: Settings, tp: TopicPartition, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(**aiokafka_config(settings), acks="all", linger_ms=5)
    await producer.start()
    try:
        sent = [await producer.send(tp.topic, v, key=b"k", partition=tp.partition) for v in values]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def _read(shared: SharedConsumer, reader: object, count: int,
                into: list[tuple[TopicPartition, bytes]] | None = None,
                batch: int | None = None) -> list[tuple[TopicPartition, bytes]]:
    """Until `count` records came to `reader` (waited for: no deadline)."""
    got = [] if into is None else into
    while len(got) < count:
        records = await shared.getmany(reader, timeout_ms=200, max_records=batch)
        got.extend((tp, r.value or b"") for tp, rs in records.items() for r in rs)
    return got


async def test_each_reader_gets_its_own_partitions_records_once_across_the_others_reassignment(
        settings: Settings) -> None:
    """Reader A reads the events topic, reader B one threads partition. B has taken
    part of its records, with more fetched and not yet taken, when A takes another
    partition and lets go of one: B goes on from where it was, no record repeated or
    skipped, and A reads its new partition from where it sought."""
    ensure_topics(settings)
    events, threads = settings.topics.events, settings.topics.threads
    a_first, a_new, b_tp = TopicPartition(events, 0), TopicPartition(events, 1), \
        TopicPartition(threads, 0)
    b_values = [b"b%03d" % i for i in range(300)]
    await _produce(settings, b_tp, b_values)
    await _produce(settings, a_first, [b"a-old"])
    await _produce(settings, a_new, [b"skipped", b"a-new"])
    shared = SharedConsumer(settings)
    await shared.start()
    try:
        a, b = object(), object()
        shared.assign(a, [a_first])
        await shared.consumer.seek_to_beginning(a_first)
        shared.assign(b, [b_tp])
        await shared.consumer.seek_to_beginning(b_tp)
        got_b = await _read(shared, b, 10, batch=10)  # the rest of the fetch stays buffered
        assert [v for _, v in got_b] == b_values[:10]
        got_a = await _read(shared, a, 1)
        assert got_a == [(a_first, b"a-old")]

        shared.assign(a, [a_new])  # let go of a_first, take a_new
        shared.consumer.seek(a_new, 1)
        assert shared.partitions(a) == {a_new} and shared.partitions(b) == {b_tp}
        assert await shared.consumer.position(b_tp) == 10

        await _read(shared, b, len(b_values), into=got_b)
        assert [v for _, v in got_b] == b_values
        assert {tp for tp, _ in got_b} == {b_tp}
        assert await _read(shared, a, 1) == [(a_new, b"a-new")]
    finally:
        await shared.stop()


async def test_a_backlog_on_one_readers_partitions_does_not_hold_back_the_others(
        settings: Settings) -> None:
    """Reader A has a backlog on every threads and messages partition, many fetches'
    worth; reader B one record on the events topic, written before A starts. With A
    taking its records as fast as they come, B's record comes while A's backlog is far
    from read: each partition has its part of every fetch."""
    ensure_topics(settings)
    part = SharedConsumer.PARTITION_FETCH_BYTES
    a_tps = [TopicPartition(topic, p) for topic in (settings.topics.threads,
                                                    settings.topics.messages)
             for p in range(settings.partitions)]
    each = [bytes(16 << 10)] * (8 * part // (16 << 10))  # 8 fetches' worth a partition
    for tp in a_tps:
        await _produce(settings, tp, each)
    b_tp = TopicPartition(settings.topics.events, settings.partitions - 1)
    await _produce(settings, b_tp, [b"decision"])
    total = len(each) * len(a_tps)
    shared = SharedConsumer(settings)
    await shared.start()
    try:
        a, b = object(), object()
        shared.assign(a, a_tps)
        await shared.consumer.seek_to_beginning(*a_tps)
        shared.assign(b, [b_tp])
        await shared.consumer.seek_to_beginning(b_tp)
        read_by_a: list[tuple[TopicPartition, bytes]] = []
        draining = asyncio.create_task(_read(shared, a, total, into=read_by_a))
        assert await _read(shared, b, 1) == [(b_tp, b"decision")]
        seen = len(read_by_a)
        await draining
        print(f"A had read {seen} of {total} records when B's came")
        assert seen < total // 2, "B's record waited for A's backlog"
    finally:
        await shared.stop()


async def test_a_reader_without_partitions_waits_and_gets_nothing(settings: Settings) -> None:
    """`getmany` of a reader with no partitions must not hand it the others' records
    (aiokafka's `getmany()` with no partition named drains them all)."""
    ensure_topics(settings)
    tp = TopicPartition(settings.topics.events, 0)
    await _produce(settings, tp, [b"theirs"])
    shared = SharedConsumer(settings)
    await shared.start()
    try:
        owner, idle = object(), object()
        shared.assign(owner, [tp])
        await shared.consumer.seek_to_beginning(tp)
        shared.assign(idle, [])
        fetched = shared.consumer._fetcher._records  # aiokafka's fetched, not yet taken
        while tp not in fetched:  # the owner's record is fetched: a marker, not a deadline
            await asyncio.sleep(0.01)
        assert await shared.getmany(idle, timeout_ms=50) == {}
        assert await _read(shared, owner, 1) == [(tp, b"theirs")]
    finally:
        await shared.stop()


async def test_another_readers_assignment_keeps_a_pause_and_waits_for_no_offset_reset(
        settings: Settings) -> None:
    """A reader pauses a partition it was just given and has not sought yet; another
    reader taking partitions meanwhile must leave it paused, and must not wait for
    its offset reset (aiokafka's `position()` would, until the fetch in flight comes
    back: 200 ms at a gateway's rebalance, in which a stream asked of the new owner
    was refused, when the stream feed read through this consumer)."""
    ensure_topics(settings)
    stream, threads = settings.topics.stream, settings.topics.threads
    given, kept = TopicPartition(stream, 0), TopicPartition(stream, 1)
    await _produce(settings, given, [b"s0"])
    await _produce(settings, kept, [b"k0", b"k1"])
    shared = SharedConsumer(settings)
    await shared.start()
    try:
        first, second = object(), object()
        shared.assign(first, [kept])
        shared.consumer.seek(kept, 1)
        shared.assign(first, [kept, given])
        shared.consumer.pause(given)
        assert _known_position(shared.consumer, given) is None
        assert _known_position(shared.consumer, kept) == 1
        shared.assign(second, [TopicPartition(threads, 0)])  # synchronous: nothing waited
        assert given in shared.consumer.paused()
        assert _known_position(shared.consumer, kept) == 1
        assert await _read(shared, first, 1) == [(kept, b"k1")]
        shared.consumer.seek(given, 0)
        shared.consumer.resume(given)
        assert await _read(shared, first, 1) == [(given, b"s0")]
    finally:
        await shared.stop()
