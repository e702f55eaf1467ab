"""Replay from Kafka: positions older than the feed's window, for one request.

A short-lived, group-less, read_committed consumer reads the thread's partition
from `scan_from` up to the window's `covered_after`, keeps the thread's records and
runs them through a fresh `RunTracker`. Reading from the run's `run_accepted`
record (its offset travels in every event id) rebuilds the filter state the feed
had, so the replayed events equal the ones the feed made, id for id. Only events
after `after` are yielded; the caller then continues from the window.

If the run's start or the position itself is older than the partition's log start
offset (retention), `ReplayGone` is raised before anything is yielded.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator

from aiokafka import TopicPartition

from gateway.kafka import new_consumer, stop_client
from gateway.sse import Position, RunTracker, SseEvent, make_events
from streams.config import Settings
from streams.serialization import DecodeError, decode_stream

__all__ = ["ReplayGone", "replay"]

MAX_REPLAY_S = 60.0


class ReplayGone(Exception):
    """The records to replay are no longer in the topic."""


async def replay(settings: Settings, partition: int, thread_id: str, *, scan_from: int,
                 after: Position, until: Position, run_id: str | None = None,
                 from_time_ms: int | None = None) -> AsyncGenerator[SseEvent, None]:
    """The thread's (or run's) events in (after, until], read from Kafka.

    With `from_time_ms`, the scan starts at the first record at or after that time
    instead of at `scan_from` (for a run whose start offset nobody remembers)."""
    consumer = new_consumer(settings, fetch_max_wait_ms=50)
    await consumer.start()
    try:
        tp = TopicPartition(settings.topics.stream, partition)
        consumer.assign([tp])
        begin = (await consumer.beginning_offsets([tp]))[tp]
        if from_time_ms is not None:
            hit = (await consumer.offsets_for_times({tp: max(0, from_time_ms)}))[tp]
            scan_from = max(begin, hit.offset if hit is not None else until[0] + 1)
        elif scan_from < begin or (after[0] if after[1] < 0 else after[0] + 1) < begin:
            raise ReplayGone(f"partition {partition} starts at {begin}, the replay at {scan_from}")
        last = until[0] if until[1] >= 0 else until[0] - 1  # the last offset to read
        if scan_from > last:
            return
        consumer.seek(tp, scan_from)
        tracker, key = RunTracker(), thread_id.encode()
        deadline = time.monotonic() + MAX_REPLAY_S
        while await consumer.position(tp) <= last:
            if time.monotonic() > deadline:
                raise TimeoutError(f"replay of {thread_id} did not reach offset {last}")
            batch = await consumer.getmany(tp, timeout_ms=200, max_records=2000)
            for record in batch.get(tp, []):
                if record.offset > last:
                    return
                if record.key != key:
                    continue
                try:
                    meta, output = decode_stream(record.value or b"")
                except DecodeError:
                    continue
                state = tracker.admit(thread_id, record.offset, output)
                if state is None:
                    continue
                for event in make_events(partition, record.offset, state.start, meta, output):
                    if after < event.position <= until and run_id in (None, event.run_id):
                        yield event
    finally:
        await stop_client(consumer)
