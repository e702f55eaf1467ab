"""A group-less, read_committed reader of assigned partitions on librdkafka, with the
part of aiokafka's consumer interface the stream feed and the decisions use.

Why not aiokafka here: aiokafka is Python, and each of its fetches (a request built
and sent, a response parsed partition by partition) costs a gateway 0.4-0.6 ms of
CPU, whatever its share of the partitions (issue #26). librdkafka fetches in its own
C threads; the event loop is handed batches. The stream topic is most of a gateway's
records and the events topic is read whole by every gateway, so those two are read
so; the gateway group's membership stays with aiokafka (`gateway.live.feed`), whose
assignor API the sticky assignment with standby copies is written against.

One thread polls librdkafka (`getmany` waits on it). Seeks, pauses and the
assignment are asked for on the event loop and made on the consumer at once if the
thread is not polling, else by the thread before its next poll slice, in order:
confluent-kafka's calls from another thread wait until a poll returns. A batch the
thread had already taken when a partition was sought (or assigned anew) holds
records from before the seek: its records of that partition are dropped and the
partition is sought again to where it was asked, so that what the caller sees after
`seek` starts at the offset it asked for, as with aiokafka. Positions and
watermarks asked for while the thread polls are as the thread last read them.

Fetches are batched while records come faster than the event loop takes them
(`batch_ms`, `THREADLINE_GATEWAY_FETCH_BATCH_MS`): librdkafka sends a partition's next
fetch only once what it fetched before was taken, or `batch_ms` later
(`queued.min.messages` 1, `fetch.queue.backoff.ms`). A record that finds no record
waiting ahead of it is fetched at once (the long poll is out); one that comes within
`batch_ms` of the one before may wait up to `batch_ms`, and a fetch then brings all
that came meanwhile. Without it every record came in a fetch of its own under a
steady trickle: 85 ms of librdkafka's CPU a second at 2,000 records a second, 21 with
it (`bench.feed_broker`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError
from confluent_kafka import Consumer, KafkaException, Message
from confluent_kafka import TopicPartition as RdPartition

from streams.config import Settings
from streams.kafka.clients import librdkafka_config

__all__ = ["LibrdkafkaReader", "Record"]

log = logging.getLogger("threadline.gateway")

# One poll of the thread at most so long: `stop` waits for it, and a position asked
# for while it polls (`position`) is learned after it.
POLL_SLICE_S = 0.02


class Record:
    """A record as the feed reads it (aiokafka's ConsumerRecord's names)."""

    __slots__ = ("headers", "key", "offset", "timestamp", "value")

    def __init__(self, offset: int, key: bytes | None, value: bytes | None,
                 headers: object, timestamp: int) -> None:
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.timestamp = timestamp


class LibrdkafkaReader:
    """Reads the partitions it is told to, from the offsets it is told to (see the
    module). Not a group member: nothing is committed."""

    def __init__(self, settings: Settings, topic: str, *, name: str = "feed",
                 batch_ms: int | None = None, max_queued_kib: int = 8192) -> None:
        if batch_ms is None:
            batch_ms = settings.gateway.fetch_batch_ms
        batching: dict[str, Any] = {"queued.min.messages": 1, "fetch.queue.backoff.ms": batch_ms} \
            if batch_ms > 0 else {"queued.min.messages": 10_000}
        self.topic, self.name = topic, name
        self._config: dict[str, Any] = librdkafka_config(
            settings,
            # librdkafka wants one; a consumer that only assigns never joins it.
            **{"group.id": f"{settings.topic_prefix}gateway-reader-unused",
               "client.id": f"threadline-gateway-{name}",
               "isolation.level": "read_committed",
               "enable.auto.commit": False, "enable.auto.offset.store": False,
               "auto.offset.reset": "earliest",
               "fetch.wait.max.ms": 100,  # an idle partition's long poll; a record ends it
               # Bounds what librdkafka prefetches ahead of the feed (its default: 64 MiB).
               "queued.max.messages.kbytes": max_queued_kib, **batching})
        self._consumer: Consumer | None = None
        self._thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{name}-reader")
        self._assigned: set[int] = set()  # in librdkafka's assignment
        self._pending: set[int] = set()  # assigned by the caller, no offset sought yet
        self._paused: set[int] = set()
        self._sought: dict[int, int] = {}  # partition -> where it was last sought
        self._epoch: dict[int, int] = {}  # partition -> seeks so far
        self._tps: dict[int, TopicPartition] = {}
        # Positions as of records handed out (or none in flight), per partition with
        # the epoch they were read at: librdkafka's own runs ahead of what the caller
        # has while the thread holds records not handed over yet.
        self._known: dict[int, tuple[int, int]] = {}
        # The thread polls for a `getmany`: calls on the consumer then wait in `_ops`
        # for the thread (confluent-kafka's pause and watermark calls from another
        # thread wait until the poll returns: up to a `getmany`'s whole timeout).
        self._busy = False
        self._ops: deque[Callable[[Consumer], object]] = deque()
        self._sample = False  # a position was asked for: the thread reads them
        # High watermarks as last fetched: the thread reads them once asked for
        # (confluent-kafka's call for them waits while another thread polls).
        self._highwaters: dict[int, int] = {}
        self._sample_highwaters = False
        self._closed = False

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Make the librdkafka consumer (it connects in its own threads)."""
        self._consumer = Consumer(self._config, logger=log)

    async def stop(self) -> None:
        """Close the consumer once the polling thread is done with it."""
        if self._closed:
            return
        self._closed = True
        consumer, self._consumer = self._consumer, None
        loop = asyncio.get_running_loop()
        if consumer is not None:
            await loop.run_in_executor(self._thread, consumer.close)
        self._thread.shutdown(wait=False)

    @property
    def _client(self) -> Consumer:
        if self._consumer is None:
            raise IllegalStateError("the reader is not started, or stopped")
        return self._consumer

    # --- the assignment -------------------------------------------------------------

    def assign(self, tps: list[TopicPartition]) -> None:
        """Read these partitions (and no others) once each is sought."""
        wanted = {tp.partition for tp in tps}
        self.unassign([self._tp(p) for p in (self._assigned | self._pending) - wanted])
        self._pending |= wanted - self._assigned

    def unassign(self, tps: list[TopicPartition]) -> None:
        """Stop reading these partitions, and forget where they were."""
        gone = [tp.partition for tp in tps if tp.partition in self._assigned | self._pending]
        if not gone:
            return
        live = [p for p in gone if p in self._assigned]
        if live:
            gone_tps = [RdPartition(self.topic, p) for p in live]
            self._call(lambda c: c.incremental_unassign(gone_tps))
        for p in gone:
            self._assigned.discard(p)
            self._pending.discard(p)
            self._paused.discard(p)
            self._sought.pop(p, None)
            self._epoch[p] = self._epoch.get(p, 0) + 1

    def keep_only(self, partitions: set[int]) -> None:
        """Read none but these partitions (those kept read on where they were), and
        forget the others' pauses."""
        self.unassign([self._tp(p) for p in self._assigned | self._pending
                       if p not in partitions])
        self._paused &= partitions

    def assignment(self) -> set[TopicPartition]:
        """The partitions read, or to be read once sought."""
        return {self._tp(p) for p in self._assigned | self._pending}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read the partition on from `offset` (assigning it if it is not yet)."""
        p = tp.partition
        if p in self._assigned:
            # Unassigned and assigned again: librdkafka's seek fails on a partition
            # whose fetcher has not started yet, and this purges what it prefetched.
            self._call(lambda c: c.incremental_unassign([RdPartition(self.topic, p)]))
        self._call(lambda c: c.incremental_assign([RdPartition(self.topic, p, offset)]))
        if p in self._paused:
            self._call(lambda c: c.pause([RdPartition(self.topic, p)]))
        self._assigned.add(p)
        self._pending.discard(p)
        self._sought[p] = offset
        self._epoch[p] = self._epoch.get(p, 0) + 1

    def pause(self, *tps: TopicPartition) -> None:
        """Fetch nothing more of these partitions until resumed. Records of them
        already fetched may still come in the next batch."""
        ps = [tp.partition for tp in tps]
        self._paused.update(ps)
        live = [RdPartition(self.topic, p) for p in ps if p in self._assigned]
        if live:
            self._call(lambda c: c.pause(live))

    def resume(self, *tps: TopicPartition) -> None:
        """Fetch these partitions again."""
        ps = [tp.partition for tp in tps]
        self._paused.difference_update(ps)
        live = [RdPartition(self.topic, p) for p in ps if p in self._assigned]
        if live:
            self._call(lambda c: c.resume(live))

    async def position(self, tp: TopicPartition) -> int:
        """The offset of the next record the caller will be handed (transaction markers
        and aborted records passed), as of the records it was handed. While a
        `getmany` waits, as the thread last read it (it reads it again within a
        poll slice of being asked)."""
        p = tp.partition
        if p not in self._assigned:
            raise IllegalStateError(f"partition {p} is not assigned")
        epoch = self._epoch.get(p, 0)
        if not self._busy:  # every record librdkafka gave out was handed over
            self._drain(self._client)
            [at] = self._client.position([RdPartition(self.topic, p)])
            if at.offset >= 0:
                return int(at.offset)
        else:
            self._sample = True
            at_epoch, offset = self._known.get(p, (-1, -1))
            if at_epoch == epoch and offset >= 0:
                return offset
        return self._sought.get(p, 0)  # nothing handed out since the seek

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's high watermark as last fetched, or None before that. While
        a `getmany` waits, as the thread last read it (asking has it read them all
        within a poll slice)."""
        p = tp.partition
        if p not in self._assigned:
            return None
        if not self._busy:
            self._drain(self._client)
            self._read_highwaters(self._client, [RdPartition(self.topic, p)])
        else:
            self._sample_highwaters = True
        return self._highwaters.get(p)

    def _read_highwaters(self, consumer: Consumer, read: list[RdPartition]) -> None:
        for at in read:
            try:
                _low, high = consumer.get_watermark_offsets(at, cached=True)
            except KafkaException:  # none fetched yet
                continue
            if high >= 0:
                self._highwaters[at.partition] = int(high)

    async def ends(self, tps: list[TopicPartition], timeout_s: float = 10.0) -> \
            dict[TopicPartition, int]:
        """The partitions' last stable offsets now (read_committed), asked of the
        broker on this reader's connection. Not while a `getmany` is out."""
        assert not self._busy, "ends() while the thread polls"
        client = self._client

        def ask() -> dict[TopicPartition, int]:
            return {tp: int(client.get_watermark_offsets(
                RdPartition(self.topic, tp.partition), timeout=timeout_s, cached=False)[1])
                for tp in tps}

        return await asyncio.to_thread(ask)

    # --- records --------------------------------------------------------------------

    async def getmany(self, timeout_ms: int = 0, max_records: int = 2000) -> \
            dict[TopicPartition, list[Record]]:
        """The records fetched since the last call, waiting up to `timeout_ms` for one."""
        client = self._client
        self._drain(client)
        epochs = dict(self._epoch)
        read = [RdPartition(self.topic, p) for p in sorted(self._assigned)]
        loop = asyncio.get_running_loop()
        self._busy = True  # until the thread is done with the consumer (`_poll`)
        messages, positions = await loop.run_in_executor(
            self._thread, self._poll, client, timeout_ms / 1000, max_records, read, epochs)
        return self._batch(messages, epochs, positions)

    def _call(self, op: Callable[[Consumer], object]) -> None:
        """Make a call on the consumer now, or on the thread if it polls (in order)."""
        if self._busy:
            self._ops.append(op)
            return
        client = self._client
        self._drain(client)
        _apply(op, client)

    def _drain(self, consumer: Consumer) -> None:
        while self._ops:
            _apply(self._ops.popleft(), consumer)

    def _batch(self, messages: list[Message], epochs: dict[int, int],
               positions: Sequence[RdPartition] = ()) -> dict[TopicPartition, list[Record]]:
        self._learn(positions, epochs)
        batch: dict[TopicPartition, list[Record]] = {}
        stale: set[int] = set()
        for message in messages:
            error = message.error()
            if error is not None:
                log.warning("%s reader: %s", self.name, error)
                continue
            p = cast(int, message.partition())  # set on a record: None only on errors
            if self._epoch.get(p, 0) != epochs.get(p, 0) or p not in self._assigned:
                stale.add(p)
                continue
            tp = self._tps.get(p) or self._tp(p)
            records = batch.get(tp)
            if records is None:
                records = batch[tp] = []
            records.append(Record(cast(int, message.offset()), message.key(), message.value(),
                                  message.headers(), message.timestamp()[1]))
        # Fetched before a seek that came while the thread polled: read them again
        # from where the seek asked (records after it may be among those dropped).
        for p in stale:
            if p in self._assigned:
                self.seek(self._tp(p), self._sought[p])
        return batch

    def _learn(self, positions: Sequence[RdPartition], epochs: dict[int, int]) -> None:
        for at in positions:
            p = at.partition
            if at.offset >= 0 and at.error is None and self._epoch.get(p, 0) == epochs.get(p, 0):
                self._known[p] = (epochs.get(p, 0), at.offset)

    def _poll(self, consumer: Consumer, timeout_s: float, max_records: int,
              read: list[RdPartition], epochs: dict[int, int]) -> \
            tuple[list[Message], list[RdPartition]]:
        """On the reader's thread: wait up to `timeout_s` for a record, then take what
        else is queued (librdkafka's `consume` would wait for a full batch). With the
        positions after them, read here: librdkafka's move as records are taken."""
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                self._drain(consumer)
                first = consumer.poll(min(POLL_SLICE_S, max(0.0, deadline - time.monotonic())))
                if first is not None:
                    break
                if self._sample and read:  # asked while nothing is held: they are current
                    self._sample = False
                    self._learn(consumer.position(read), epochs)
                if self._sample_highwaters:
                    self._sample_highwaters = False
                    self._read_highwaters(consumer, read)
                if self._closed or time.monotonic() >= deadline:
                    return [], consumer.position(read) if read else []
            messages = [first] if max_records <= 1 else \
                [first, *consumer.consume(max_records - 1, 0)]
            return messages, consumer.position(read) if read else []
        finally:
            self._busy = False

    def _tp(self, partition: int) -> TopicPartition:
        tp = self._tps.get(partition)
        if tp is None:
            tp = self._tps[partition] = TopicPartition(self.topic, partition)
        return tp


def _apply(op: Callable[[Consumer], object], consumer: Consumer) -> None:
    try:
        op(consumer)
    except KafkaException as exc:  # e.g. a partition assigned twice: logged, not fatal
        log.warning("%s: %s", consumer, exc)
