"""`gateway.librdkafka_reader.LibrdkafkaReader`, the stream feed's reader: what the
caller is handed after a seek starts where it asked, transaction markers and aborted
records are passed, a batch taken before a seek is not handed out (a real broker, and
its bookkeeping on a stand-in client)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from confluent_kafka import Message, Producer

from gateway.librdkafka_reader import LibrdkafkaReader, Record
from streams.config import Settings
from streams.kafka.clients import librdkafka_config
from streams.kafka.topics import ensure_topics


async def _values(reader: LibrdkafkaReader, count: int) -> list[tuple[int, bytes]]:
    """The next `count` records handed out, waited for (no deadline)."""
    got: list[tuple[int, bytes]] = []
    while len(got) < count:
        for records in (await reader.getmany(timeout_ms=500)).values():
            got.extend((r.offset, r.value or b"") for r in records)
    return got


def _produce(settings: Settings, topic: str, partition: int, txid: str,
             commits: list[bytes], aborted: bytes | None = None) -> None:
    producer = Producer(librdkafka_config(settings, **{"transactional.id": txid}))
    producer.init_transactions()
    for value in commits:
        producer.begin_transaction()
        producer.produce(topic, value, b"reader", partition=partition)
        producer.commit_transaction()
    if aborted is not None:
        producer.begin_transaction()
        producer.produce(topic, aborted, b"reader", partition=partition)
        producer.flush()
        producer.abort_transaction()


@pytest.mark.kafka
async def test_the_reader_starts_where_sought_and_passes_markers_and_aborts(
        settings: Settings) -> None:
    """Three committed records and an aborted one, each in a transaction of its own
    (offsets: record, marker, record, marker, ...): sought to the first marker, the
    reader hands out the second and third records only, and its position is then the
    partition's end, past the markers and the aborted record (what a feed's catch-up
    compares with the last stable offset, which `ends` gives). Sought back to 0 while it waits in a poll,
    it hands out from the first record on."""
    ensure_topics(settings)
    topic, partition = settings.topics.stream, 3
    tp = TopicPartition(topic, partition)
    reader = LibrdkafkaReader(settings, topic)
    await reader.start()
    try:
        reader.assign([tp])
        await asyncio.to_thread(_produce, settings, topic, partition, "reader-a",
                                [b"one", b"two", b"three"], aborted=b"aborted")
        first = 0  # a fresh topic (this test's prefix)
        reader.seek(tp, first + 1)  # the first transaction's marker
        assert await _values(reader, 2) == [(first + 2, b"two"), (first + 4, b"three")]
        position = await reader.position(tp)
        while position < first + 8:  # the abort's marker is the eighth offset
            assert not await reader.getmany(timeout_ms=300), "a record past the end"
            position = await reader.position(tp)
        assert position == first + 8
        assert await reader.ends([tp]) == {tp: first + 8}, "the last stable offset"

        polling = asyncio.create_task(reader.getmany(timeout_ms=2000))
        await asyncio.sleep(0.05)  # the thread waits in a poll
        reader.seek(tp, first)
        got = [(r.offset, r.value) for rs in (await polling).values() for r in rs]
        got += await _values(reader, 3 - len(got)) if len(got) < 3 else []
        assert got[:3] == [(first, b"one"), (first + 2, b"two"), (first + 4, b"three")]
    finally:
        await reader.stop()


class _Message:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 1, 1000


def _messages(*at: tuple[int, int]) -> list[Message]:
    return cast(list[Message], [_Message(partition, offset) for partition, offset in at])


class _Client:
    """A stand-in for librdkafka's consumer: records the assignment calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[tuple[int, int]]]] = []

    def _log(self, name: str, tps: list[Any]) -> None:
        self.calls.append((name, [(tp.partition, tp.offset) for tp in tps]))

    def incremental_assign(self, tps: list[Any]) -> None:
        self._log("assign", tps)

    def incremental_unassign(self, tps: list[Any]) -> None:
        self._log("unassign", tps)

    def pause(self, tps: list[Any]) -> None:
        self._log("pause", tps)

    def resume(self, tps: list[Any]) -> None:
        self._log("resume", tps)


def _reader(settings: Settings) -> tuple[LibrdkafkaReader, _Client]:
    reader = LibrdkafkaReader(settings, "stream")
    client = _Client()
    reader._consumer = client  # type: ignore[assignment]
    return reader, client


def test_a_batch_taken_before_a_seek_is_dropped_and_read_again(settings: Settings) -> None:
    """Partition 1 is sought while a batch is out: its records in the batch (from
    before the seek, or after it) are not handed out, and it is sought again where
    asked, so the next batch begins there. Partition 2's records go through."""
    reader, client = _reader(settings)
    reader.seek(TopicPartition("stream", 1), 10)
    reader.seek(TopicPartition("stream", 2), 0)
    epochs = dict(reader._epoch)  # as `getmany` took them
    reader.seek(TopicPartition("stream", 1), 4)  # while the thread polls
    client.calls.clear()
    batch = reader._batch(_messages((1, 10), (2, 0), (1, 4)), epochs)
    assert {tp.partition: [r.offset for r in rs] for tp, rs in batch.items()} == {2: [0]}
    assert client.calls == [("unassign", [(1, -1001)]), ("assign", [(1, 4)])]
    # The next batch is current: handed out.
    batch = reader._batch(_messages((1, 4)), dict(reader._epoch))
    assert [r.offset for rs in batch.values() for r in rs] == [4]
    assert isinstance(next(iter(batch.values()))[0], Record)


def test_a_partition_let_go_of_forgets_its_pause(settings: Settings) -> None:
    """A partition paused before it was sought (a new one waiting for its start),
    then let go of: its records still in a batch are dropped, and sought again later
    it is read, not left paused."""
    reader, client = _reader(settings)
    tp = TopicPartition("stream", 5)
    reader.seek(TopicPartition("stream", 0), 0)
    reader.pause(tp)
    assert client.calls[-1] == ("assign", [(0, 0)]), "a partition not read is not paused"
    epochs = dict(reader._epoch)
    reader.keep_only({0})
    assert reader.assignment() == {TopicPartition("stream", 0)}
    assert not reader._batch(_messages((5, 7)), epochs)
    client.calls.clear()
    reader.seek(tp, 3)
    assert client.calls == [("assign", [(5, 3)])]


@pytest.mark.kafka
async def test_a_record_close_behind_another_waits_for_the_batch_wait(settings: Settings) -> None:
    """With a batch wait of 1.5 s: record A, fetched while nobody takes it, puts off
    the partition's next fetch until A is taken and 1.5 s have passed, so record B,
    written once A is handed out, comes at least 1.5 s after A was written (a lower
    bound no load can break; with the wait not set, B comes at once)."""
    ensure_topics(settings)
    topic, partition, wait_s = settings.topics.stream, 2, 1.5
    tp = TopicPartition(topic, partition)
    reader = LibrdkafkaReader(settings, topic, batch_ms=int(wait_s * 1000))
    producer = Producer(librdkafka_config(settings))
    await reader.start()
    try:
        reader.assign([tp])
        reader.seek(tp, 0)
        while reader.highwater(tp) is None:  # librdkafka starts fetching at a first poll
            assert not await reader.getmany(timeout_ms=200)
        written = time.monotonic()
        producer.produce(topic, b"A", b"batch", partition=partition)
        await asyncio.to_thread(producer.flush, 30)
        # Fetched (the watermark comes with the fetch that brings A), and not taken:
        # no getmany polled meanwhile.
        while reader.highwater(tp) != 1:
            await asyncio.sleep(0.01)
        assert [value for _, value in await _values(reader, 1)] == [b"A"]
        producer.produce(topic, b"B", b"batch", partition=partition)
        await asyncio.to_thread(producer.flush, 30)
        assert [value for _, value in await _values(reader, 1)] == [b"B"]
        assert time.monotonic() - written >= wait_s, "the next fetch did not wait"
    finally:
        await reader.stop()


async def test_a_position_asked_while_the_thread_polls_is_as_of_what_was_handed_out(
        settings: Settings) -> None:
    """librdkafka's position moves as its poll takes records, before they are handed
    over: while a `getmany` is out, the position is the last one the thread read with
    nothing held (or at the seek), and asking makes it read it again; between calls it
    is librdkafka's."""
    reader, client = _reader(settings)
    tp = TopicPartition("stream", 2)
    client.position = lambda tps: [SimpleNamespace(partition=t.partition, offset=50,  # type: ignore[attr-defined]
                                                   error=None) for t in tps]
    reader.seek(tp, 10)
    reader._busy = True
    assert await reader.position(tp) == 10 and reader._sample, "at the seek, and asked for"
    reader._learn(client.position([tp]), dict(reader._epoch))  # type: ignore[attr-defined]
    assert await reader.position(tp) == 50
    stale = dict(reader._epoch)
    reader.seek(tp, 20)
    reader._learn([SimpleNamespace(partition=2, offset=70, error=None)], stale)  # type: ignore[list-item]
    assert await reader.position(tp) == 20, "read before the seek: not taken"
    reader._busy = False
    assert await reader.position(tp) == 50


def test_calls_made_while_the_thread_polls_wait_for_it_in_order(settings: Settings) -> None:
    """confluent-kafka's pause and watermark calls from the event loop wait while the
    thread polls (up to a whole `getmany`: a gateway's scrape of its lags took 1 s a
    partition so). While it polls, the reader's calls wait for the thread instead, and
    are made in the order they were asked for, before its next poll."""
    reader, client = _reader(settings)
    tp = TopicPartition("stream", 1)
    reader.seek(tp, 0)
    client.calls.clear()
    reader._busy = True
    reader.pause(tp)
    reader.seek(tp, 9)
    reader.resume(tp)
    assert reader.highwater(tp) is None and reader._sample_highwaters
    assert client.calls == [], "nothing made on the consumer while the thread polls"
    reader._drain(client)  # type: ignore[arg-type]
    assert client.calls == [("pause", [(1, -1001)]), ("unassign", [(1, -1001)]),
                            ("assign", [(1, 9)]), ("pause", [(1, -1001)]),
                            ("resume", [(1, -1001)])]
