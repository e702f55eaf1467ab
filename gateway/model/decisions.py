"""Commands out, decisions back: the gateway's side of the processor.

`CommandBus.decide` publishes a command (acks=all, idempotent producer) and waits
for the processor's decision on it. One events consumer per process (no group, all
partitions, read_committed, from the end at start) resolves the waiters. A decision
is matched to its command by the W3C `traceparent` the gateway puts on each command:
the processor copies it onto every event it decides, and each command gets its own
span id, so even two requests with the same message id are told apart.
A command that decides several events (a DeleteThread on a thread with a live run:
RunCancelled, then ThreadDeleted) is answered by the kind of event the caller
names (`until`).

Each command names this process in its `threadline-reply-to` header (a random id per
process), which the processor copies onto the events it decides; with the events'
`threadline-payload` header, a gateway decodes only its own decisions and the kinds
every gateway needs (a run's start and end: read-your-writes, joins), and hands the
rest on by thread and kind, undecoded (`on_undecoded`): with several gateways, each
decodes its share of the decisions, not all of them (issue #26). Events without the
headers (older processors) are decoded, as before.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections import defaultdict
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from gateway.http.problems import Problem
from gateway.kafka import (
    FetchBatching,
    new_consumer,
    run_forever,
    stop_client,
    stop_task,
    topic_partitions,
)
from gateway.model.placement import stay_here
from streams.aio import within
from streams.clock import now_ms
from streams.config import Settings
from streams.core.domain import TERMINAL_EVENTS, Command, Event
from streams.kafka.clients import aiokafka_config
from streams.observability.metrics import gateway_metrics
from streams.observability.tracing import fresh_traceparent_in_current, publish_span, tracer
from streams.wire import REPLY_HEADER, Codec, DecodeError, header_value, new_meta, payload_named

__all__ = ["CommandBus", "new_traceparent"]

log = logging.getLogger("threadline.gateway")

# What every gateway decodes, whoever asked: a run's start and end (read-your-writes
# of runs, and the watchers of a run's end).
_DECODED = frozenset(name.encode() for name in (
    "RunAccepted", "RunCompleted", "RunFailed", "RunCancelled"))

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-[0-9a-f]{16}-([0-9a-f]{2})")


def new_traceparent(incoming: str | None = None) -> str:
    """A traceparent with a fresh span id, in the caller's trace if it sent a valid one
    (with tracing on: in the request's server span's trace, sampled or not as it is)."""
    traced = fresh_traceparent_in_current() if tracer() is not None else None
    if traced is not None:
        return traced
    match = _TRACEPARENT.fullmatch(incoming.strip().lower()) if incoming else None
    trace_id = match.group(1) if match and match.group(1) != "0" * 32 else secrets.token_hex(16)
    flags = match.group(2) if match else "01"
    return f"00-{trace_id}-{secrets.token_hex(8)}-{flags}"


class CommandBus:
    """Sends commands to Kafka and waits for the processor's decisions on the events topic."""
    def __init__(self, settings: Settings, codec: Codec | None = None) -> None:
        self.settings = settings
        # THREADLINE_SCHEMA_REGISTRY_URL: the Confluent format; else single-object.
        self.codec = codec or Codec.from_settings(settings)
        self.on_event: Callable[[Event], None] | None = None  # every decision decoded
        # Every decision not decoded: its thread and its payload type (`_DECODED`).
        self.on_undecoded: Callable[[str, bytes], None] | None = None
        self.reply_id = secrets.token_hex(8).encode()  # this process, in REPLY_HEADER
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None  # made in start(): needs the loop
        self._waiters: dict[str, tuple[asyncio.Future[Event], Callable[[Event], bool]]] = {}
        self._run_watchers: defaultdict[str, set[asyncio.Future[Event]]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._batching: FetchBatching | None = None

    async def start(self) -> None:
        """Start the producer, and a consumer reading decisions from the events topic's current end."""
        # No linger: a lone post's command leaves at once (a 2 ms linger held each for
        # 2 ms); under load, commands still share a request while the one before it is
        # in flight (aiokafka has one produce request in flight a broker).
        self._producer = AIOKafkaProducer(
            **aiokafka_config(self.settings), acks="all", enable_idempotence=True, linger_ms=0)
        await self._producer.start()
        consumer = self._consumer = new_consumer(self.settings)
        await consumer.start()
        self._batching = FetchBatching(consumer, self.settings.gateway.fetch_batch_ms)
        tps = topic_partitions(self.settings, self.settings.topics.events)
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:  # fix the positions now: decisions on later commands come after
            await consumer.position(tp)
        self._task = asyncio.create_task(run_forever("events consumer", self._step))

    async def stop(self) -> None:
        """Stop the events consumer task and close both Kafka clients."""
        await stop_task(self._task)
        if self._consumer is not None:
            await stop_client(self._consumer)
        if self._producer is not None:
            await stop_client(self._producer)

    async def publish(self, command: Command, tenant: str, traceparent: str | None) -> \
            tuple[int, int]:
        """Queue `command` durably and return its (partition, offset); Problem 503 if
        Kafka does not take it."""
        assert self._producer is not None, "CommandBus.start() first"
        stay_here()  # published: the request can no longer be sent on whole
        meta = new_meta(command.thread_id, tenant, now_ms(), traceparent)
        name = type(command).__name__
        try:
            with publish_span(self.settings.topics.commands, name, command.thread_id) as traced:
                sent = await self._producer.send_and_wait(
                    self.settings.topics.commands, self.codec.encode_command(command, meta),
                    key=command.thread_id.encode(),
                    headers=[*(traced or ()), (REPLY_HEADER, self.reply_id)])
            gateway_metrics().commands.inc(name)
        except KafkaError as exc:
            log.warning("publishing %s failed: %s", type(command).__name__, exc)
            raise Problem(503, "unavailable",
                          "the command could not be queued; retry the request") from exc
        return sent.partition, sent.offset

    async def decide(self, command: Command, tenant: str, traceparent: str,
                     watch_run: str | None = None, until: type[Event] | None = None,
                     answers: Callable[[Event], bool] | None = None) -> Event | None:
        """Publish `command` and return the first event decided on it (with `until`,
        the first of that type; with `answers`, the first it holds of: a decision the
        command leads to through other commands, such as a copy's last part), or None
        if none came within `decision_timeout_ms` (the command stays queued and will
        be decided).

        With `watch_run`, a terminal event of that run also answers (a cancel that
        arrives after the run ended decides nothing)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Event] = loop.create_future()
        self._waiters[traceparent] = (
            future, answers or (lambda event: until is None or isinstance(event, until)))
        if watch_run is not None:
            self._run_watchers[watch_run].add(future)
        try:
            await self.publish(command, tenant, traceparent)
            return await within(asyncio.shield(future),
                                          self.settings.gateway.decision_timeout_ms / 1000)
        except TimeoutError:
            gateway_metrics().pending.inc(type(command).__name__)  # answered 202 pending
            return None
        finally:
            self._waiters.pop(traceparent, None)
            if watch_run is not None:
                watchers = self._run_watchers.get(watch_run)
                if watchers is not None:
                    watchers.discard(future)
                    if not watchers:
                        del self._run_watchers[watch_run]

    async def _step(self) -> None:
        assert self._consumer is not None
        batch = await self._consumer.getmany(timeout_ms=1000, max_records=1000)
        if self._batching is not None:
            self._batching.took(batch)
        await self.codec.prepare(r.value for rs in batch.values() for r in rs)
        for records in batch.values():
            for record in records:
                kind = payload_named(record.headers)
                if kind is not None and kind not in _DECODED and \
                        header_value(record.headers, REPLY_HEADER) != self.reply_id:
                    if self.on_undecoded is not None:
                        self.on_undecoded((record.key or b"").decode(), kind)
                    continue
                try:
                    meta, event = self.codec.decode_event(record.value or b"")
                except DecodeError as exc:
                    log.debug("skipping an undecodable event: %s", exc)
                    continue
                if self.on_event is not None:
                    self.on_event(event)
                waiter = self._waiters.get(meta.traceparent or "")
                if waiter is not None and waiter[1](event):
                    del self._waiters[meta.traceparent or ""]
                    if not waiter[0].done():
                        waiter[0].set_result(event)
                if isinstance(event, TERMINAL_EVENTS):
                    for watcher in self._run_watchers.pop(event.run_id, ()):
                        if not watcher.done():
                            watcher.set_result(event)
