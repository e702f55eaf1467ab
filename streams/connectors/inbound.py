"""The inbound endpoint: Slack Events API callbacks in, turns on Kafka, then 200.

    POST /slack/events   signed by Slack (see `slack_events`); 401 if not
    GET  /healthz        200 once the Kafka producer is set up
    GET  /stats          the process's counters (`ConnectorStats`) as JSON

A turn is acknowledged only when it is durable: first the audit record that
authorizes it (`inbound_event`, on the audit topic), then `CreateThread` and
`PostUserMessage` on the commands topic, each acked by all in-sync replicas
(`acks=all`, idempotent producer, murmur2 partitioner on the thread id). Only
then does Slack get 200, within `inbound_timeout_s` (2.5 s: Slack waits 3 s).
If a write fails or is late the answer is 503, and Slack redelivers; the
redelivery derives the same message id, so the processor decides it once
(a repeated `CreateThread` decides nothing, a repeated message is a duplicate).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator

from aiohttp import web
from confluent_kafka import KafkaError, Message, Producer

from streams.aio import within
from streams.clock import now_ms
from streams.config import Settings
from streams.connectors.audit import AuditKind, ConnectorAudit
from streams.connectors.config import ConnectorConfig
from streams.connectors.slack_events import Turn, turn_of, verify
from streams.connectors.stats import ConnectorStats
from streams.connectors.topics import audit_topic
from streams.core.domain import CreateThread, PostUserMessage
from streams.kafka.clients import librdkafka_config
from streams.wire import Codec, new_meta
from streams.wire.connector import encode_audit

__all__ = ["KafkaWriter", "WriteFailed", "create_inbound_app"]

log = logging.getLogger("threadline.connector.inbound")

Record = tuple[str, bytes, bytes]  # topic, key, value


class WriteFailed(Exception):
    """A record was not acknowledged by Kafka in time."""


class KafkaWriter:
    """An `acks=all` idempotent producer whose writes can be awaited.

    librdkafka connects lazily, so the writer starts even while Kafka is away;
    a write then fails after `timeout_s` and the request is answered 503.
    """

    def __init__(self, settings: Settings, client_id: str, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.producer = Producer(librdkafka_config(settings, **{
            "client.id": client_id, "log_level": 3,
            "acks": "all", "enable.idempotence": True, "partitioner": "murmur2_random",
            "linger.ms": 1, "message.timeout.ms": max(1, int(timeout_s * 1000)),
        }))
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="inbound-producer", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    async def write(self, records: list[Record], timeout_s: float) -> None:
        """Produce `records` and wait until Kafka has acked every one; else WriteFailed."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = []
        for topic, key, value in records:
            future: asyncio.Future[None] = loop.create_future()
            futures.append(future)

            def delivered(err: KafkaError | None, _msg: Message,
                          future: asyncio.Future[None] = future) -> None:
                loop.call_soon_threadsafe(_settle, future, err)

            try:
                self.producer.produce(topic, value, key, on_delivery=delivered)
            except Exception as exc:  # BufferError (queue full), or the producer broke
                raise WriteFailed(f"{topic}: {exc}") from exc
        try:
            await within(asyncio.gather(*futures), max(timeout_s, 0.001))
        except TimeoutError as exc:
            raise WriteFailed(f"not acknowledged within {timeout_s:.2f}s") from exc

    def close(self) -> None:
        """Stop the delivery poller and flush what the producer still holds."""
        self._stop.set()
        self._poller.join(5)
        self.producer.flush(5)


def _settle(future: asyncio.Future[None], err: KafkaError | None) -> None:
    if future.done():
        return
    if err is None:
        future.set_result(None)
    else:
        future.set_exception(WriteFailed(str(err)))


# --- the app ---------------------------------------------------------------------------

CONFIG = web.AppKey("config", ConnectorConfig)
SETTINGS = web.AppKey("settings", Settings)
STATS = web.AppKey("stats", ConnectorStats)
WRITER = web.AppKey("writer", KafkaWriter)
INSTANCE = web.AppKey("instance", str)
CODEC = web.AppKey("codec", Codec)  # the role's, from its settings (the registry URL)


def create_inbound_app(settings: Settings, config: ConnectorConfig, stats: ConnectorStats,
                       instance_id: str, codec: Codec) -> web.Application:
    """The HTTP app that takes Slack events, writes them to Kafka, and serves health and stats."""
    app = web.Application(client_max_size=1 << 20)
    app[CONFIG], app[SETTINGS], app[STATS], app[INSTANCE] = config, settings, stats, instance_id
    app[CODEC] = codec
    app.cleanup_ctx.append(_writer_ctx)
    app.router.add_post("/slack/events", _slack_events)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/stats", _stats)
    return app


async def _writer_ctx(app: web.Application) -> AsyncIterator[None]:
    writer = KafkaWriter(app[SETTINGS], f"connector-inbound-{app[INSTANCE]}",
                         app[CONFIG].inbound_timeout_s)
    app[WRITER] = writer
    await asyncio.to_thread(app[CODEC].register_schemas)  # blocking HTTP: off the loop
    yield
    await asyncio.to_thread(writer.close)


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATS].snapshot())


async def _slack_events(request: web.Request) -> web.Response:
    app, started = request.app, time.monotonic()
    config, stats = app[CONFIG], app[STATS]
    body = await request.read()
    if not verify(config.signing_secret, request.headers.get("X-Slack-Request-Timestamp"), body,
                  request.headers.get("X-Slack-Signature"), now_s=time.time(),
                  window_s=config.signature_window_s):
        stats.add("inbound_refused")
        return web.json_response({"ok": False, "error": "invalid_signature"}, status=401)
    try:
        payload = json.loads(body)
        if not isinstance(payload, dict):
            raise ValueError("not a JSON object")
    except ValueError:
        return web.json_response({"ok": False, "error": "invalid_json"}, status=400)
    if payload.get("type") == "url_verification":
        return web.json_response({"challenge": payload.get("challenge", "")})
    turn = turn_of(payload)
    if turn is None:
        stats.add("inbound_ignored")
        return web.json_response({"ok": True})
    retry = request.headers.get("X-Slack-Retry-Num")
    try:
        deadline = started + config.inbound_timeout_s
        # The record that authorizes the turn first: if it cannot be written, neither is the turn.
        await app[WRITER].write([_audit_record(app, turn, retry)], deadline - time.monotonic())
        await app[WRITER].write(_turn_records(app[SETTINGS], app[CODEC], turn), deadline - time.monotonic())
    except WriteFailed as exc:
        stats.add("inbound_failed")
        log.warning("event %s not queued (%s): answering 503 so that Slack redelivers",
                    turn.event_id, exc)
        return web.json_response({"ok": False, "error": "not_durable"}, status=503)
    stats.add("inbound_accepted")
    return web.json_response({"ok": True})


def _turn_records(settings: Settings, codec: Codec, turn: Turn) -> list[Record]:
    now = now_ms()
    key, topic = turn.thread_id.encode(), settings.topics.commands
    create = CreateThread(turn.thread_id, turn.tenant, turn.title, now)
    post = PostUserMessage(turn.thread_id, turn.tenant, turn.message_id, turn.text, None, now)
    return [(topic, key, codec.encode_command(create, new_meta(turn.thread_id, turn.tenant, now))),
            (topic, key, codec.encode_command(post, new_meta(turn.thread_id, turn.tenant, now)))]


def _audit_record(app: web.Application, turn: Turn, retry: str | None) -> Record:
    detail = {"event_id": turn.event_id, "team": turn.address.team,
              "channel": turn.address.channel, "thread_ts": turn.address.thread_ts,
              "ts": turn.ts, "user": turn.user, "message_id": turn.message_id,
              "text_chars": len(turn.text), "retry_num": retry}
    audit = ConnectorAudit(audit_id=str(uuid.uuid4()), thread_id=turn.thread_id,
                           kind=AuditKind.INBOUND_EVENT, outbox_id=None,
                           instance_id=app[INSTANCE], detail_json=json.dumps(detail),
                           at_ms=now_ms())
    return audit_topic(app[SETTINGS]), turn.thread_id.encode(), encode_audit(audit)
