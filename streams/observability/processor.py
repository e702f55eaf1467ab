"""What the processor shows: its metrics and its decision spans, kept off its hot path.

`ProcessorObserver` is the processor's one object for both. Per record it costs a
dict increment (counts are staged per batch and reach Prometheus only once the
batch's transaction commits, so an aborted batch counts nothing) and, with tracing
on, a check of the record's sampled flag: a span is made only for sampled traces.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition
from opentelemetry.trace import Span, SpanKind

from streams.kafka.loop import TransactionPhases
from streams.observability import tracing
from streams.observability.metrics import processor_metrics

__all__ = ["ProcessorObserver"]

LAG_INTERVAL_S = 1.0
Headers = list[tuple[str, str | bytes | None]] | None


class ProcessorObserver:
    """The processor's metrics and spans."""

    def __init__(self, topic: str) -> None:
        self.metrics = processor_metrics()
        self.topic = topic
        self._counts: dict[tuple[str, str], int] = {}
        self._events: dict[str, int] = {}
        self._dead: dict[str, int] = {}
        self._state_headers: dict[tuple[int, bytes], list[tuple[str, str | bytes | None]]] = {}
        self._next_lag = 0.0
        self._lag_partitions: set[int] = set()

    # --- per batch ---------------------------------------------------------------

    def begin(self) -> None:
        """A new batch: nothing staged."""
        self._counts.clear()
        self._events.clear()
        self._dead.clear()
        self._state_headers.clear()

    def command(self, command: object, outcome: str) -> None:
        """One command of the batch and what came of it (decided, unchanged, dead_lettered)."""
        key = (type(command).__name__, outcome)
        self._counts[key] = self._counts.get(key, 0) + 1

    def events(self, events: Iterable[object]) -> None:
        """The events one command decided."""
        for event in events:
            name = type(event).__name__
            self._events[name] = self._events.get(name, 0) + 1

    def dead_letter(self, error_type: str) -> None:
        """A record of the batch goes to the dead-letter topic."""
        self._dead[error_type] = self._dead.get(error_type, 0) + 1

    def committed(self, records: int) -> None:
        """The batch's transaction committed: add what it staged."""
        metrics = self.metrics
        metrics.batch_records.observe(records)
        for (command, outcome), count in self._counts.items():
            metrics.commands.inc(command, outcome, amount=count)
        for event, count in self._events.items():
            metrics.events.inc(event, amount=count)
        for error_type, count in self._dead.items():
            metrics.dead_letters.inc(error_type, amount=count)
        self.begin()

    def aborted(self) -> None:
        """The batch's transaction aborted: it counts nothing but the abort."""
        self.metrics.aborts.inc()
        self.begin()

    def commit_took(self, seconds: float, phases: TransactionPhases) -> None:
        """How long a transaction took from begin to commit, and each phase of it."""
        self.metrics.commit_seconds.observe(seconds)
        for phase, took in zip(phases._fields, phases, strict=True):
            self.metrics.phase_seconds(phase).observe(took)  # type: ignore[union-attr]

    # --- traces ------------------------------------------------------------------

    def start_decision(self, msg: Message, traceparent: str | None, command: object,
                       thread_id: str) -> Span | None:
        """A span for deciding this command if its trace is sampled (and tracing is on)."""
        tracer = tracing.tracer()
        if tracer is None:
            return None
        parent = tracing.record_traceparent(msg.headers(), traceparent)
        if not tracing.sampled(parent):
            return None
        name = type(command).__name__
        span = tracer.start_span(f"decide {name}", tracing.context_of(parent), SpanKind.CONSUMER,
                                 attributes={"messaging.system": "kafka",
                                             "messaging.destination.name": self.topic,
                                             "messaging.kafka.partition": msg.partition() or 0,
                                             "messaging.kafka.offset": msg.offset() or 0,
                                             "threadline.command": name,
                                             "threadline.thread_id": thread_id})
        run_id = getattr(command, "run_id", None)
        if isinstance(run_id, str):
            span.set_attribute("threadline.run_id", run_id)
        return span

    def end_decision(self, span: Span | None, outcome: str, partition: int, key: bytes,
                     events: Iterable[Any] = ()) -> Headers:
        """End the decision's span; the headers naming it for the records it writes."""
        if span is None:
            return None
        span.set_attribute("threadline.outcome", outcome)
        names = [type(e).__name__ for e in events]
        if names:
            span.set_attribute("threadline.events", names)
        span.end()
        headers = tracing.header_of(tracing.traceparent_of(span))
        if headers is not None:
            self._state_headers[(partition, key)] = headers
        return headers

    def state_headers(self, partition: int, key: bytes) -> Headers:
        """Headers for a thread's state record: its last traced decision of the batch."""
        return self._state_headers.get((partition, key)) if self._state_headers else None

    # --- between steps -----------------------------------------------------------

    def rebalanced(self, change: str, partitions: int) -> None:
        """Partitions were assigned or revoked."""
        self.metrics.rebalances.inc(change)

    def restored(self, seconds: float) -> None:
        """The tables of an assignment's partitions were restored."""
        self.metrics.restore_seconds.observe(seconds)

    def deadlines(self, tracked: int, due: int, ticks: int) -> None:
        """Deadlines tracked and past due at this tick, and the ticks it sent."""
        self.metrics.deadlines.set(tracked)
        self.metrics.due_deadlines.set(due)
        if ticks:
            self.metrics.deadline_ticks.inc(ticks)

    def lag(self, consumer: Consumer, positions: dict[int, int]) -> None:
        """At most once a second: each owned partition's consumer lag (from the consumer's
        cached end offsets, no request to the broker)."""
        now = time.monotonic()
        if now < self._next_lag:
            return
        self._next_lag = now + LAG_INTERVAL_S
        metrics = self.metrics
        metrics.partitions.set(len(positions))
        for partition in self._lag_partitions - set(positions):
            metrics.consumer_lag(str(partition)).set(0)  # type: ignore[union-attr]
        self._lag_partitions = set(positions)
        for partition, position in list(positions.items()):
            try:
                _, high = consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                         cached=True)
            except Exception:
                continue
            if high >= 0 and position >= 0:
                metrics.consumer_lag(str(partition)).set(max(0, high - position))  # type: ignore[union-attr]
