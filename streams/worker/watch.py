"""The worker's lifecycle follower: reads the `RunLifecycle` records the processor
mirrors into the stream topic, on the partitions this worker owns, into run fates.

A second, group-less consumer; an attempt whose run ended, or whose attempt number
is past, is stopped by the worker as soon as the follower learns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from streams.aio import know_topics, stop_client, within
from streams.clock import now_ms
from streams.config import Settings
from streams.core.journal import JournalEntry, entry_from_json
from streams.core.lifecycle import Lifecycle, RunFate
from streams.core.records import RunLifecycle
from streams.kafka.clients import aiokafka_config
from streams.wire import Codec, DecodeError, payload_named

__all__ = ["LifecycleWatch"]

log = logging.getLogger("threadline.worker")

LIFECYCLE_MARGIN_MS = 5_000  # clock slack when looking for a dispatch's lifecycle records
CATCH_UP_TIMEOUT_S = 5.0
# A fetch comes back on the first record, or after this when nothing is written: an
# idle worker asks 10 times a second (at 10 ms, 100 times: with the processor's 20 ms,
# most of an idle stack's broker CPU, issue #22). Not longer: a seek (a dispatch's
# `prepare`) or a new assignment waits for the fetch parked at the broker.
WATCH_FETCH_WAIT_MS = 100
# What paces the fetches while records flow: read, then this pause, in which the next
# fetch is under way (aiokafka sends none for a node while its records wait unread).
WATCH_PACE_S = 0.01
# Most stream records are answers' parts, which the worker writes naming their payload
# (`PAYLOAD_HEADER`): only lifecycle records and unnamed ones (older writers) are decoded.
WANTED = (None, RunLifecycle.__name__.encode())
FATES_KEPT = 100_000  # runs whose fate is remembered, most recent first
JOURNALS_KEPT = 10_000  # runs whose recorded steps are remembered, most recent first


class LifecycleWatch:
    """Reads `RunLifecycle` records of the owned stream partitions into run fates,
    and the `step_recorded` ones into the steps each live run has journaled."""

    def __init__(self, settings: Settings, client_id: str,
                 on_fate: Callable[[str, RunFate], None], codec: Codec,
                 on_step: Callable[[str, JournalEntry], None] = lambda run, entry: None,
                 on_execution: Callable[[str, str], None] = lambda run, execution: None) -> None:
        self.topic = settings.topics.stream
        # What the offsets client is asked about: the stream, and the dispatch topic
        # (the worker's `_mark_fresh`).
        self.known_topics = (settings.topics.stream, settings.topics.dispatch)
        self.codec = codec
        self.on_fate = on_fate
        self.on_step = on_step
        self.on_execution = on_execution
        self.fates: OrderedDict[str, RunFate] = OrderedDict()
        self.journals: OrderedDict[str, dict[int, JournalEntry]] = OrderedDict()
        self.covered_from: dict[int, int] = {}  # partition -> records read since (ms)
        self.caught_up: set[int] = set()  # read to the end at least once since assignment
        self._ready = asyncio.Event()  # set while `follow` is not under way
        self.consumer = AIOKafkaConsumer(
            **aiokafka_config(settings), client_id=f"{client_id}-lifecycle",
            group_id=None, enable_auto_commit=False, isolation_level="read_committed",
            auto_offset_reset="latest", request_timeout_ms=15_000,
            # Most records here are other executions' text deltas: a fetch for each of
            # them was most of the worker's CPU while answers stream, so `_loop` paces
            # the reads (at most 100 fetches a second, however much is written). An
            # execution's barrier and a dispatch's `prepare` wait for what this reads:
            # a record is read within a pause of its commit, not after a long-poll.
            fetch_max_wait_ms=WATCH_FETCH_WAIT_MS,
        )
        # Offset queries on a client of their own: a broker answers one connection's
        # requests in order, so behind the consumer's long-poll they would wait for it.
        self.offsets = AIOKafkaConsumer(
            **aiokafka_config(settings), client_id=f"{client_id}-lifecycle-offsets",
            group_id=None, enable_auto_commit=False, isolation_level="read_committed",
            request_timeout_ms=15_000,
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the consumers and the reading loop."""
        await self.offsets.start()
        await know_topics(self.offsets, self.known_topics)
        await self.consumer.start()
        self._task = asyncio.create_task(self._loop(), name="lifecycle-watch")

    async def stop(self) -> None:
        """Stop reading and close the consumer."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await stop_client(self.consumer)
        await stop_client(self.offsets)

    def journal_of(self, run_id: str) -> list[JournalEntry]:
        """The steps of `run_id` seen recorded (since its dispatches were prepared)."""
        return list(self.journals.get(run_id, {}).values())

    def fate(self, run_id: str) -> RunFate | None:
        """What the records read so far say of `run_id`; None if nothing."""
        return self.fates.get(run_id)

    async def follow(self, partitions: set[int]) -> None:
        """Read exactly `partitions`: kept ones where they were, new ones from now."""
        self._ready.clear()
        try:
            kept: dict[int, int] = {}
            for tp in self.consumer.assignment():
                if tp.partition in partitions:
                    with contextlib.suppress(TimeoutError, KafkaError):  # then: from now
                        kept[tp.partition] = await within(self.consumer.position(tp), 5)
            self.consumer.assign([TopicPartition(self.topic, p) for p in sorted(partitions)])
            for p, offset in kept.items():
                self.consumer.seek(TopicPartition(self.topic, p), offset)
            since = now_ms() - LIFECYCLE_MARGIN_MS
            self.covered_from = {p: self.covered_from.get(p, since) for p in kept}
            self.caught_up = {p for p in self.caught_up if p in kept}
            new = partitions - kept.keys()
            await self._seek_to_time(new, since)
            self.covered_from.update(dict.fromkeys(new, since))
        finally:
            self._ready.set()

    async def prepare(self, partition: int, timestamp_ms: int) -> None:
        """Before running a dispatch written at `timestamp_ms`: make sure the fates
        of its run are known, by reading the partition from that time to its end
        if it was not read that far back, or not yet to its end since assignment."""
        await self._ready.wait()
        since = timestamp_ms - LIFECYCLE_MARGIN_MS
        if partition not in self.covered_from:
            return  # no longer ours
        if since < self.covered_from[partition]:
            log.debug("lifecycle partition %d: reading again from %d", partition, since)
            self.covered_from[partition] = since
            self.caught_up.discard(partition)
            await self._seek_to_time({partition}, since)
        if partition not in self.caught_up and await self._catch_up(partition):
            self.caught_up.add(partition)
        log.debug("lifecycle partition %d: caught up", partition)

    async def _catch_up(self, partition: int) -> bool:
        """Wait until the partition is read to its current end; False on timeout."""
        tp = TopicPartition(self.topic, partition)
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        try:
            end = (await self.offsets.end_offsets([tp]))[tp]
            while time.monotonic() < deadline:
                if await within(self.consumer.position(tp), CATCH_UP_TIMEOUT_S) >= end:
                    return True
                await asyncio.sleep(0.005)
        except (TimeoutError, KafkaError) as exc:
            log.warning("lifecycle catch-up on partition %d failed: %s", partition, exc)
        return False

    async def _seek_to_time(self, partitions: set[int], timestamp_ms: int) -> None:
        """Seek each of `partitions` to its first record at or after `timestamp_ms`: two
        offset queries for all of them, not two each (12 partitions a worker start)."""
        if not partitions:
            return
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        log.debug("lifecycle partitions %s: seeking to time %d", sorted(partitions), timestamp_ms)
        try:
            found = await self.offsets.offsets_for_times(dict.fromkeys(tps, max(timestamp_ms, 0)))
            # Nothing that new: the end. A plain `seek` takes effect at once, where
            # `seek_to_end` waits for an offset reset by the fetcher.
            past = [tp for tp in tps if found.get(tp) is None]
            ends = await self.offsets.end_offsets(past) if past else {}
            for tp in tps:
                hit = found.get(tp)
                self.consumer.seek(tp, ends[tp] if hit is None else hit.offset)
        except KafkaError as exc:  # e.g. no longer assigned after a rebalance
            log.warning("lifecycle seek on partitions %s failed: %s", sorted(partitions), exc)

    async def _loop(self) -> None:
        while True:
            if not self.consumer.assignment():
                await asyncio.sleep(0.05)
                continue
            try:
                batch = await self.consumer.getmany(timeout_ms=200, max_records=2_000)
                wanted = [r.value or b"" for records in batch.values() for r in records
                          if payload_named(r.headers) in WANTED]
                await self.codec.prepare(wanted)
                for value in wanted:
                    self._read(value)
                if batch:
                    await asyncio.sleep(WATCH_PACE_S)
            except Exception:  # keep following: a dead follower would stop no attempt
                log.exception("reading lifecycle records")
                await asyncio.sleep(0.5)

    def _read(self, value: bytes) -> None:
        try:
            _, output = self.codec.decode_stream(value)
        except DecodeError:
            return
        if not isinstance(output.payload, RunLifecycle):
            return
        if output.payload.event == Lifecycle.EXECUTION_STARTED:
            self.on_execution(output.run_id, output.payload.detail)
            return
        if output.payload.event == Lifecycle.STEP_RECORDED:
            entry = entry_from_json(output.payload.detail)
            if entry is not None:
                steps = self.journals.pop(output.run_id, None) or {}
                steps.setdefault(entry.step, entry)
                self.journals[output.run_id] = steps
                while len(self.journals) > JOURNALS_KEPT:
                    self.journals.popitem(last=False)
                self.on_step(output.run_id, steps[entry.step])
            return
        fate = self.fates.pop(output.run_id, None) or RunFate()
        fate.learn(output.payload.event, output.attempt, output.payload.detail)
        self.fates[output.run_id] = fate
        while len(self.fates) > FATES_KEPT:
            self.fates.popitem(last=False)
        if fate.ended:
            self.journals.pop(output.run_id, None)
        self.on_fate(output.run_id, fate)
