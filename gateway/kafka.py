"""Small aiokafka helpers shared by the gateway's Kafka clients."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sized

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import murmur2
from aiokafka.structs import OffsetAndTimestamp

from streams.aio import know_topics, stop_client
from streams.config import Settings
from streams.kafka.clients import aiokafka_config

__all__ = ["FetchBatching", "Offsets", "new_consumer", "partition_for", "run_forever",
           "stop_client", "stop_task", "topic_partitions"]

log = logging.getLogger("threadline.gateway")


@functools.lru_cache(maxsize=16384)
def partition_for(thread_id: str, partitions: int) -> int:
    """The partition of a thread's records: Kafka's murmur2 partitioner on the key.
    Cached: aiokafka's murmur2 is Python (6 µs), and a request asks it several times."""
    return int(murmur2(thread_id.encode()) & 0x7FFFFFFF) % partitions


def topic_partitions(settings: Settings, topic: str) -> list[TopicPartition]:
    """Every partition of a topic, from the configured partition count."""
    # The topic contract (checked by ensure_topics) fixes the partition count.
    return [TopicPartition(topic, p) for p in range(settings.partitions)]


def new_consumer(settings: Settings, **overrides: object) -> AIOKafkaConsumer:
    """A group-less, read_committed consumer; the caller assigns partitions."""
    config: dict[str, object] = {
        **aiokafka_config(settings),
        "group_id": None,
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": 100,
    }
    config.update(overrides)
    return AIOKafkaConsumer(**config)


async def run_forever(name: str, step: Callable[[], Awaitable[None]]) -> None:
    """Call `step` until cancelled; log and back off on errors instead of dying."""
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; retrying", name)
            await asyncio.sleep(1.0)


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel a background task and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class Offsets:
    """List-offsets queries (read_committed: end = last stable offset) on a client of
    their own. A broker answers one connection's requests in order, so behind a
    consumer's long-poll fetch they would wait up to `fetch_max_wait_ms`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: AIOKafkaConsumer | None = None  # made in start(): needs the loop

    async def start(self) -> None:
        """Open the client used for the offset queries, knowing the topics it is asked
        about: else the first query of each paid aiokafka's 100 ms metadata retry, and
        a new or restarted gateway's first thread read took 205 ms, its first stream
        open 103 more (`know_topics`)."""
        self._client = new_consumer(self.settings)
        await self._client.start()
        topics = self.settings.topics
        await know_topics(self._client, (topics.stream, topics.threads, topics.messages))

    async def stop(self) -> None:
        """Close the client used for the offset queries."""
        if self._client is not None:
            await stop_client(self._client)

    @property
    def client(self) -> AIOKafkaConsumer:
        """The started consumer that answers the offset queries."""
        assert self._client is not None, "Offsets.start() first"
        return self._client

    async def end(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The last stable offset of each partition."""
        return dict(await self.client.end_offsets(tps))

    async def beginning(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The earliest offset still kept in each partition."""
        return dict(await self.client.beginning_offsets(tps))

    async def for_times(self, times: dict[TopicPartition, int]) -> \
            dict[TopicPartition, OffsetAndTimestamp | None]:
        """The first offset at or after each given timestamp, or None past the end."""
        return dict(await self.client.offsets_for_times(times))


class FetchBatching:
    """Batches a consumer's fetches while its traffic is sustained, and only then.

    aiokafka is Python: each fetch (a request built and sent, a response parsed, its
    records handed over) costs a gateway 0.4-0.6 ms of CPU. A fetch that returns at
    the first record (`fetch_min_bytes` 1: what low latency needs) brings one record
    at a time under a steady trickle, so following 500 records a second cost 0.2 of a
    core, and 8,000 a second 0.45 (`bench.feed_broker`). While batches come `_busy`
    times in `SPAN_S` (four fifths of one per `wait_ms`), fetches ask the broker for
    `min_bytes` or `wait_ms`, whichever comes first: at most `wait_ms` more latency,
    at most one fetch per `wait_ms`. Once half as many come, they return at the first
    record again: a quiet or lightly used gateway adds no latency, and neither do a
    run's few records in a burst. librdkafka's `fetch.wait.max.ms` and
    `fetch.min.bytes` do the same, but fixed.

    aiokafka reads both from its fetcher each time it builds a fetch request (private
    attributes, checked by tests/gateway/test_fetch_batching.py); without them this
    does nothing.
    """

    SPAN_S = 0.1

    def __init__(self, consumer: AIOKafkaConsumer, wait_ms: int, min_bytes: int = 64 << 10,
                 clock: Callable[[], float] = time.monotonic) -> None:
        fetcher = getattr(consumer, "_fetcher", None)  # made by start()
        usable = fetcher is not None and all(
            hasattr(fetcher, name) for name in ("_fetch_min_bytes", "_fetch_max_wait_ms"))
        self._fetcher = fetcher if usable else None
        self.wait_ms = wait_ms if usable and wait_ms > 0 else 0
        self._latency = (getattr(fetcher, "_fetch_min_bytes", 1),
                         getattr(fetcher, "_fetch_max_wait_ms", 100))
        self._batched = (min_bytes, self.wait_ms)
        self._busy = max(2, int(self.SPAN_S * 1000 / max(1, self.wait_ms) * 0.8))
        self._quiet = max(1, self._busy // 2)
        self._clock = clock
        self._times: deque[float] = deque(maxlen=self._busy)
        self.batching = False
        self.switches = 0

    def took(self, batch: Mapping[object, Sized]) -> None:
        """After each `getmany`: what it handed out (empty after its timeout)."""
        if not self.wait_ms:
            return
        now = self._clock()
        if any(len(records) for records in batch.values()):
            self._times.append(now)
        recent = sum(1 for at in self._times if now - at <= self.SPAN_S)
        if not self.batching and recent >= self._busy:
            self._set(True)
        elif self.batching and recent < self._quiet:
            self._set(False)

    def _set(self, batching: bool) -> None:
        min_bytes, wait_ms = self._batched if batching else self._latency
        setattr(self._fetcher, "_fetch_min_bytes", min_bytes)  # noqa: B010 (private, see above)
        setattr(self._fetcher, "_fetch_max_wait_ms", wait_ms)  # noqa: B010
        self.batching = batching
        self.switches += 1
