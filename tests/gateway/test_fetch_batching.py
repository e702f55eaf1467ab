"""`gateway.kafka.FetchBatching`: a consumer's fetches batch while its traffic is
sustained and return at the first record otherwise; aiokafka honours the fetcher
settings it changes (a real broker)."""

from __future__ import annotations

import inspect
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.consumer.fetcher import Fetcher

from gateway.kafka import FetchBatching, new_consumer
from streams.config import Settings
from streams.kafka.clients import aiokafka_config
from streams.kafka.topics import ensure_topics
from tests.manual_clock import ManualClock


def _consumer() -> Any:
    return SimpleNamespace(_fetcher=SimpleNamespace(_fetch_min_bytes=1, _fetch_max_wait_ms=100))


def _batch(records: int) -> dict[Any, list[Any]]:
    """What `getmany` hands out: `records` records of one partition (none: empty)."""
    return {"tp": [object()] * records} if records else {}


def _fetch(consumer: Any) -> tuple[int, int]:
    return consumer._fetcher._fetch_min_bytes, consumer._fetcher._fetch_max_wait_ms


def test_sustained_batches_batch_the_fetches_and_thin_traffic_ends_it() -> None:
    """Batches 2 ms apart: once 16 came within 100 ms (four fifths of one per 5 ms),
    fetches wait for 64 KiB or 5 ms; batches 30 ms apart: they return at the first
    record again."""
    clock, consumer = ManualClock(100.0), _consumer()
    batching = FetchBatching(consumer, 5, clock=clock)
    for _ in range(15):
        clock.now += 0.002
        batching.took(_batch(3))
    assert _fetch(consumer) == (1, 100) and not batching.batching
    clock.now += 0.002
    batching.took(_batch(3))
    assert _fetch(consumer) == (64 << 10, 5) and batching.batching
    for _ in range(40):  # sustained at one batch per wait
        clock.now += 0.005
        batching.took(_batch(40))
    assert batching.batching
    for _ in range(5):
        clock.now += 0.030
        batching.took(_batch(1))
    assert _fetch(consumer) == (1, 100) and not batching.batching
    assert batching.switches == 2


def test_a_burst_does_not_switch_and_a_getmany_that_timed_out_ends_batching() -> None:
    """A run's records come in bursts: 10 batches within 4 ms, then 100 ms of nothing,
    leave the fetches alone; batching, an empty getmany (its timeout passed) ends it."""
    clock, consumer = ManualClock(100.0), _consumer()
    batching = FetchBatching(consumer, 5, clock=clock)
    for _ in range(5):
        for _ in range(10):
            clock.now += 0.0004
            batching.took(_batch(1))
        clock.now += 0.1
        batching.took(_batch(0))
    assert not batching.batching and batching.switches == 0
    for _ in range(16):
        clock.now += 0.001
        batching.took(_batch(2))
    assert batching.batching
    clock.now += 1.0
    batching.took(_batch(0))
    assert not batching.batching and _fetch(consumer) == (1, 100)


def test_off_or_without_the_fetcher_settings_it_does_nothing() -> None:
    """`THREADLINE_GATEWAY_FETCH_BATCH_MS=0`, or an aiokafka without those attributes."""
    clock = ManualClock(100.0)
    for consumer, wait in ((_consumer(), 0), (SimpleNamespace(_fetcher=SimpleNamespace()), 5)):
        batching = FetchBatching(consumer, wait, clock=clock)
        for _ in range(20):
            clock.now += 0.001
            batching.took(_batch(5))
        assert not batching.batching and batching.wait_ms == 0


def test_aiokafka_builds_each_fetch_request_from_the_fetcher_settings() -> None:
    """The attributes FetchBatching sets are the ones the installed aiokafka reads when it
    builds a fetch request (a guard for an upgrade that renames them)."""
    init, build = inspect.getsource(Fetcher.__init__), \
        inspect.getsource(Fetcher._get_actions_per_node)
    for name in ("_fetch_min_bytes", "_fetch_max_wait_ms"):
        assert f"self.{name} =" in init and f"self.{name}" in build, name


async def _next_records(consumer: Any) -> tuple[list[Any], float]:
    """The next records, and when the `getmany` that returned them began."""
    while True:
        began = time.monotonic()
        got = [r for rs in (await consumer.getmany(timeout_ms=500)).values() for r in rs]
        if got:
            return got, began


@pytest.mark.kafka
async def test_a_batching_fetch_waits_as_set_against_the_broker(settings: Settings) -> None:
    """Set to batch with a 1.5 s wait and a minimum no record reaches: the fetch sent
    once record A is handed out holds record B until its wait is over, so B comes at
    least 1.5 s after the `getmany` that handed A out began (a lower bound that load
    cannot break: that fetch leaves after the call began; with the settings ignored B
    comes at once). Set back, the next record comes on the next fetch (waited for, no
    deadline)."""
    ensure_topics(settings)
    topic, wait_s = settings.topics.stream, 1.5
    consumer = new_consumer(settings)
    producer = AIOKafkaProducer(**aiokafka_config(settings), acks="all")
    await consumer.start()
    await producer.start()
    try:
        batching = FetchBatching(consumer, int(wait_s * 1000), min_bytes=1 << 30)
        batching._set(True)  # as sustained traffic would; before any fetch
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)
        await producer.send_and_wait(topic, b"A", key=b"fetch-batching", partition=0)
        got, a_began = await _next_records(consumer)
        assert [r.value for r in got] == [b"A"]
        await producer.send_and_wait(topic, b"B", key=b"fetch-batching", partition=0)
        got, _ = await _next_records(consumer)
        assert [r.value for r in got] == [b"B"]
        assert time.monotonic() - a_began >= wait_s, "the fetch did not wait as set"
        batching._set(False)
        await producer.send_and_wait(topic, b"C", key=b"fetch-batching", partition=0)
        got, _ = await _next_records(consumer)
        assert [r.value for r in got] == [b"C"]
    finally:
        await producer.stop()
        await consumer.stop()
