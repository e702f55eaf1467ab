"""The table loop's linger (issue #22): a batch whose decisions nobody waits for (a
worker's reports of an attempt's start, steps and heartbeats) takes what arrives
within `linger_s` into the same transaction, and a record somebody waits for (a
run's completion) ends the wait at once; the processor tells the two apart by the
payload header alone.

The consumer here is scripted: each `consume` with a wait delivers the next records
the test lined up, so nothing depends on the clock but the linger's own bound.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, cast

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from streams.kafka.loop import BATCH, TableLoop, TableRole
from streams.processor import UNAWAITED, _unawaited
from streams.wire import PAYLOAD_HEADER

STEP, HEARTBEAT, DONE = b"ReportStepCompleted", b"ReportHeartbeat", b"ReportAttemptCompleted"


def _record(offset: int, payload: bytes | None) -> Message:
    headers: list[tuple[str, str | bytes | None]] | None = \
        None if payload is None else [(PAYLOAD_HEADER, payload)]
    return Message(topic="commands", partition=0, offset=offset, key=b"thread",
                   value=b"", headers=headers)


class ScriptedConsumer:
    """`consume(n, 0)` hands out what has arrived; `consume(n, wait)` with nothing
    there lets the next lined-up arrival in first (an empty one: nothing came)."""

    def __init__(self, arrived: list[Message], arrivals: list[list[Message]]) -> None:
        self.queue = deque(arrived)
        self.arrivals = deque(arrivals)
        self.calls: list[tuple[int, float]] = []
        self.rebalance: Callable[[], None] | None = None  # run inside the next wait, once

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        """Up to `num_messages` of what arrived; with a wait and nothing there, the next
        arrival first. Each call written down."""
        self.calls.append((num_messages, timeout))
        if not self.queue and timeout > 0 and self.arrivals:
            rebalance, self.rebalance = self.rebalance, None
            if rebalance is not None:  # as librdkafka serves callbacks in consume
                self.queue.clear()  # and purges the revoked partitions' fetched records
                rebalance()
            self.queue.extend(self.arrivals.popleft())
        return [self.queue.popleft() for _ in range(min(num_messages, len(self.queue)))]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        """Every partition's committed offset: 0."""
        return [TopicPartition(tp.topic, tp.partition, 0) for tp in partitions]

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Nothing to do: the test lines up what is read next."""


class NoRole:
    """A role's rebalance half, doing nothing."""

    def assigned(self, partitions: list[int]) -> None:
        """Nothing to restore."""

    def revoked(self, partitions: list[int]) -> None:
        """Nothing to drop."""


def _loop(consumer: ScriptedConsumer, linger_s: float = 600.0) -> TableLoop:
    return TableLoop(cast(TableRole, NoRole()), cast(Consumer, consumer),
                     cast(Producer, object()), "commands", unawaited=_unawaited,
                     linger_s=linger_s)


def _payloads(batch: list[Message]) -> list[Any]:
    return [dict(m.headers() or {}).get(PAYLOAD_HEADER) for m in batch]


def test_step_reports_wait_for_the_completion_and_share_its_batch() -> None:
    """Two step reports, then (one arrival later) a heartbeat, then the completion:
    one batch of the four, taken as soon as the completion came (the linger's bound,
    ten minutes here, is never reached: nothing else is consumed after it)."""
    consumer = ScriptedConsumer([_record(0, STEP), _record(1, STEP)],
                                [[_record(2, HEARTBEAT)], [_record(3, DONE)], [_record(4, STEP)]])
    batch = _loop(consumer).next_batch()
    assert _payloads(batch) == [STEP, STEP, HEARTBEAT, DONE]
    assert consumer.arrivals, "the loop consumed past the completion"


def test_a_batch_somebody_waits_for_is_not_held() -> None:
    """A batch holding one awaited record (first or not) goes at once: no wait."""
    for first in ([_record(0, DONE), _record(1, STEP)], [_record(0, STEP), _record(1, DONE)]):
        consumer = ScriptedConsumer(first, [[_record(2, STEP)]])
        assert _payloads(_loop(consumer).next_batch()) == _payloads(first)
        assert consumer.calls == [(BATCH, 0)]


def test_a_record_without_the_header_is_waited_for() -> None:
    """An older writer's record names no payload: the processor cannot tell, so it
    does not hold the batch."""
    consumer = ScriptedConsumer([_record(0, None)], [[_record(1, STEP)]])
    assert len(_loop(consumer).next_batch()) == 1
    assert not _unawaited(_record(0, None)) and not _unawaited(_record(0, DONE))
    assert set(UNAWAITED) == {STEP, HEARTBEAT, b"ReportAttemptStarted", b"ReportExecutionStarted"}


def test_the_linger_ends_when_nothing_more_comes() -> None:
    """Only step reports, and nothing more within the linger: the batch goes as it is,
    after one wait (the consumer's own timeout is the linger left)."""
    consumer = ScriptedConsumer([_record(0, STEP)], [[]])
    batch = _loop(consumer, linger_s=600.0).next_batch()
    assert _payloads(batch) == [STEP]
    waits = [timeout for _, timeout in consumer.calls if timeout > 0]
    assert len(waits) == 1 and 0 < waits[0] <= 600.0


def test_without_a_linger_nothing_waits() -> None:
    """The connector relay's loop (no `unawaited`), or a linger of 0: as before."""
    consumer = ScriptedConsumer([_record(0, STEP)], [[_record(1, STEP)]])
    assert len(_loop(consumer, linger_s=0.0).next_batch()) == 1
    assert consumer.calls == [(BATCH, 0)]


def test_records_read_before_a_rebalance_are_dropped_from_the_batch() -> None:
    """Step reports linger; inside the next wait the partition is revoked and assigned
    again (librdkafka runs the callbacks inside `consume`), so it is read again from
    its committed offset: the reports read before are dropped, not decided twice, and
    the batch is what came after."""
    consumer = ScriptedConsumer([_record(0, STEP), _record(1, STEP)],
                                [[_record(0, STEP), _record(1, STEP), _record(2, DONE)]])
    loop = _loop(consumer)
    partition = [TopicPartition("commands", 0)]

    def rebalance() -> None:
        loop._on_revoke(cast(Consumer, consumer), partition)
        loop._on_assign(cast(Consumer, consumer), partition)

    consumer.rebalance = rebalance
    batch = loop.next_batch()
    assert [(m.offset(), p) for m, p in zip(batch, _payloads(batch), strict=True)] == \
        [(0, STEP), (1, STEP), (2, DONE)]


def test_each_record_is_looked_at_once_while_the_batch_lingers() -> None:
    """The linger reads each record's header once, not the whole batch again at every
    arrival (a batch grows to 500 records)."""
    looked: list[int] = []

    def counted(msg: Message) -> bool:
        looked.append(msg.offset() or 0)
        return _unawaited(msg)

    consumer = ScriptedConsumer([_record(0, STEP), _record(1, STEP)],
                                [[_record(2, STEP)], [_record(3, HEARTBEAT)], [_record(4, DONE)]])
    loop = _loop(consumer)
    loop.unawaited = counted
    assert len(loop.next_batch()) == 5
    assert sorted(looked) == [0, 1, 2, 3, 4]
