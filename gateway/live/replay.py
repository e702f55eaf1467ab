"""Replay from Kafka: positions older than the feed's window, for one request.

A short-lived, group-less, read_committed consumer reads the thread's partition
from `scan_from` up to the window's `covered_after`, keeps the thread's records and
runs them through a fresh `RunTracker`. Reading from the run's `run_accepted`
record (its offset travels in every event id) rebuilds the filter state the feed
had, so the replayed events equal the ones the feed made, id for id. Only events
after `after` are yielded; the caller then continues from the window.

If the run's start or the position itself is older than the partition's log start
offset (retention), `ReplayGone` is raised before anything is yielded; if the span
to read is longer than `max_records` offsets, `ReplayTooLong` (a `ReplayGone`: the
client fetches the message over REST). Decoding a large batch runs in a thread, so a
long replay does not hold the event loop every other stream shares.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Sequence

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from gateway.kafka import new_consumer, stop_client
from gateway.live.sse import Position, RunTracker, SseEvent, make_events
from gateway.live.tokens import ResumeTokens
from streams.config import Settings
from streams.wire import Codec, DecodeError

__all__ = ["ReplayGone", "ReplayTooLong", "replay"]

MAX_REPLAY_S = 60.0
INLINE_DECODE = 64  # records; a larger batch is decoded in a thread


class ReplayGone(Exception):
    """The records to replay are no longer in the topic."""


class ReplayTooLong(ReplayGone):
    """The span to read is longer than a replay may read."""


async def replay(settings: Settings, tokens: ResumeTokens, partition: int, thread_id: str, *,
                 scan_from: int, after: Position, until: Position, run_id: str | None = None,
                 from_time_ms: int | None = None, max_records: int = 0,
                 codec: Codec) -> AsyncGenerator[SseEvent, None]:
    """The thread's (or run's) events in (after, until], read from Kafka.

    With `from_time_ms`, the scan starts at the first record at or after that time
    instead of at `scan_from` (for a run whose start offset nobody remembers).
    `max_records` > 0 caps the offsets read (`ReplayTooLong`)."""
    last = until[0] if until[1] >= 0 else until[0] - 1  # the last offset to read
    if from_time_ms is None:
        _check_span(scan_from, last, max_records)  # before a consumer costs anything
    consumer = new_consumer(settings, fetch_max_wait_ms=50)
    await consumer.start()
    try:
        tp = TopicPartition(settings.topics.stream, partition)
        consumer.assign([tp])
        begin = (await consumer.beginning_offsets([tp]))[tp]
        if from_time_ms is not None:
            hit = (await consumer.offsets_for_times({tp: max(0, from_time_ms)}))[tp]
            scan_from = max(begin, hit.offset if hit is not None else until[0] + 1)
            _check_span(scan_from, last, max_records)
        elif scan_from < begin or (after[0] if after[1] < 0 else after[0] + 1) < begin:
            raise ReplayGone(f"partition {partition} starts at {begin}, the replay at {scan_from}")
        if scan_from > last:
            return
        consumer.seek(tp, scan_from)
        replayer = _Replayer(tokens, partition, thread_id, after, until, run_id, last, codec)
        deadline = time.monotonic() + MAX_REPLAY_S
        while await consumer.position(tp) <= last:
            if time.monotonic() > deadline:
                raise TimeoutError(f"replay of {thread_id} did not reach offset {last}")
            records = (await consumer.getmany(tp, timeout_ms=200, max_records=2000)).get(tp, [])
            await codec.prepare(r.value for r in records)
            if len(records) > INLINE_DECODE:
                events = await asyncio.to_thread(replayer.events, records)
            else:
                events = replayer.events(records)
            for event in events:
                yield event
            if replayer.finished:
                return
    finally:
        await stop_client(consumer)


def _check_span(scan_from: int, last: int, max_records: int) -> None:
    if max_records > 0 and last - scan_from + 1 > max_records:
        raise ReplayTooLong(f"the replay would read {last - scan_from + 1} records, "
                            f"more than {max_records}")


class _Replayer:
    """Records to events for one replay: one tracker, used by one thread at a time."""

    def __init__(self, tokens: ResumeTokens, partition: int, thread_id: str, after: Position,
                 until: Position, run_id: str | None, last: int, codec: Codec) -> None:
        self.codec = codec
        self.tokens, self.partition, self.thread_id = tokens, partition, thread_id
        self.after, self.until, self.run_id, self.last = after, until, run_id, last
        self.tracker, self.key = RunTracker(), thread_id.encode()
        self.finished = False

    def events(self, records: Sequence[ConsumerRecord[bytes, bytes]]) -> list[SseEvent]:
        found: list[SseEvent] = []
        for record in records:
            if record.offset > self.last:
                self.finished = True
                break
            if record.key != self.key:
                continue
            try:
                meta, output = self.codec.decode_stream(record.value or b"")
            except DecodeError:
                continue
            state = self.tracker.admit(self.thread_id, record.offset, output)
            if state is None:
                continue
            for event in make_events(self.tokens, self.partition, record.offset, state.start,
                                     meta, output):
                if self.after < event.position <= self.until and \
                        self.run_id in (None, event.run_id):
                    found.append(event)
        return found
