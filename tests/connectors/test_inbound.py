"""The inbound endpoint in-process: signatures, turns, and durable-before-200."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Consumer, TopicPartition

from streams.config import Settings
from streams.connectors.audit import AuditKind
from streams.connectors.config import ConnectorConfig
from streams.connectors.ids import ChatAddress, message_id_for
from streams.connectors.inbound import create_inbound_app
from streams.connectors.slack_events import sign, turn_of, verify
from streams.connectors.stats import ConnectorStats
from streams.connectors.topics import audit_topic, ensure_connector_topics
from streams.core.domain import CreateThread, PostUserMessage
from streams.devtools.broker import free_port
from streams.wire import Codec
from streams.wire.connector import decode_audit
from tests.connectors.chat_double import SIGNING_SECRET, ChatDouble, slack_signature
from tests.raw_http import raw_request

CODEC = Codec()  # single-object records, as the roles write them without a registry

EVENTS = ChatDouble()  # only its event payloads are used: no server


def _event(channel: str = "C1", text: str = "hi", **extra: Any) -> dict[str, Any]:
    payload = EVENTS.user_message(channel, text)
    payload["event"].update(extra)
    return payload


def _headers(body: bytes, *, secret: str = SIGNING_SECRET, at: float | None = None) -> dict[str, str]:
    stamp = str(int(time.time() if at is None else at))
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": slack_signature(secret, stamp, body),
            "Content-Type": "application/json"}


def _app(settings: Settings, **env: str) -> tuple[web.Application, ConnectorStats]:
    config = ConnectorConfig.from_env(settings, {"THREADLINE_SLACK_SIGNING_SECRET": SIGNING_SECRET,
                                                 **env})
    stats = ConnectorStats()
    return create_inbound_app(settings, config, stats, "test", Codec.from_settings(settings)), stats


# --- pure: signatures and turns ---------------------------------------------------------------


def test_signatures_match_slacks_scheme_and_the_window() -> None:
    """Slack signatures verify only for the same secret and body within five minutes."""
    body, now = b'{"type":"event_callback"}', time.time()
    stamp = str(int(now))
    assert sign("s", stamp, body) == slack_signature("s", stamp, body)
    assert verify("s", stamp, body, slack_signature("s", stamp, body), now_s=now)
    assert not verify("s", stamp, body + b" ", slack_signature("s", stamp, body), now_s=now)
    assert not verify("s", stamp, body, slack_signature("t", stamp, body), now_s=now)
    assert not verify("s", stamp, body, slack_signature("s", stamp, body), now_s=now + 301)
    assert not verify("s", stamp, body, slack_signature("s", stamp, body), now_s=now - 301)
    assert not verify("", stamp, body, slack_signature("", stamp, body), now_s=now)
    assert not verify("s", None, body, "v0=00", now_s=now)
    assert not verify("s", "soon", body, "v0=00", now_s=now)


def test_a_non_ascii_signature_is_refused_not_raised() -> None:
    """Non-ASCII signatures or timestamps are refused, never raised."""
    body, now = b'{"type":"event_callback"}', time.time()
    stamp = str(int(now))
    for signature in ["v0=\u00e9" * 10, "v0=" + "\udcff" * 64, "\u0661\u0662"]:
        assert not verify("s", stamp, body, signature, now_s=now)
    assert not verify("s", "\u0661\u0662\u0663", body, "v0=\u00e9", now_s=now)


async def test_a_non_ascii_signature_header_gets_401(tmp_path: Path) -> None:
    """A non-ASCII signature header gets 401 and is counted as refused."""
    dead = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
                              "THREADLINE_DATA_DIR": str(tmp_path)})
    app, stats = _app(dead)
    body = json.dumps(_event()).encode()
    stamp = str(int(time.time())).encode()
    async with TestServer(app, host="127.0.0.1") as server:
        for signature in [b"v0=\xc3\xa9\xc3\xa9", b"v0=\xff\xfe", "v0=\u00e9".encode("latin-1")]:
            answer = await raw_request(str(server.make_url("/")), "POST", "/slack/events", [
                (b"X-Slack-Request-Timestamp", stamp), (b"X-Slack-Signature", signature),
                (b"Content-Type", b"application/json")], body)
            assert answer.status == 401, answer
    assert stats.inbound_refused == 3 and stats.inbound_accepted == 0


def test_a_message_maps_to_the_chat_thread_it_starts_or_continues() -> None:
    """A message maps to the thread it starts or continues; a direct message is one thread."""
    top = _event("C1", "first")
    turn = turn_of(top)
    assert turn is not None
    ts = top["event"]["ts"]
    assert turn.address == ChatAddress("T0TEST", "C1", ts)
    assert turn.message_id == message_id_for("T0TEST", "C1", ts) and turn.tenant == "slack:T0TEST"
    reply = _event("C1", "second", thread_ts=ts)
    assert (t := turn_of(reply)) is not None and t.thread_id == turn.thread_id
    assert t.message_id != turn.message_id
    direct = _event("D1", "private", channel_type="im")
    assert (d := turn_of(direct)) is not None and d.address == ChatAddress("T0TEST", "D1", None)


@pytest.mark.parametrize("change", [
    {"bot_id": "B0BOT"}, {"subtype": "message_changed"}, {"subtype": "channel_join"},
    {"type": "reaction_added"}, {"channel": "not-a-slack-id"}, {"ts": None},
])
def test_what_is_not_a_persons_message_is_not_a_turn(change: dict[str, Any]) -> None:
    """Bot messages, edits, joins, other events and malformed ids are not turns."""
    assert turn_of(_event(**change)) is None


# --- in-process app ------------------------------------------------------------------------------


async def test_a_turn_that_cannot_be_written_is_answered_503_within_slacks_deadline(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A turn that cannot reach Kafka within the inbound timeout is answered 503."""
    dead = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
                              "THREADLINE_DATA_DIR": str(tmp_path)})
    app, stats = _app(dead, THREADLINE_CONNECTOR_INBOUND_TIMEOUT_S="1")
    async with TestClient(TestServer(app)) as client:
        body = json.dumps(_event()).encode()
        with caplog.at_level("WARNING", logger="threadline"):
            response = await client.post("/slack/events", data=body, headers=_headers(body))
        assert response.status == 503 and (await response.json())["error"] == "not_durable"
        # Answered because the write failed by the connector's own deadline (1 s, under
        # Slack's 3 s: the asyncio timeout and librdkafka's message.timeout.ms are both
        # set from it), rather than timed with a stopwatch on a loaded machine.
        assert "not queued" in caplog.text and "answering 503" in caplog.text, caplog.text
        # Not a turn: acknowledged without any write (a write would have failed).
        bot = json.dumps(_event(bot_id="B0BOT")).encode()
        assert (await client.post("/slack/events", data=bot, headers=_headers(bot))).status == 200
        challenge = json.dumps({"type": "url_verification", "challenge": "abc"}).encode()
        response = await client.post("/slack/events", data=challenge, headers=_headers(challenge))
        assert response.status == 200 and (await response.json()) == {"challenge": "abc"}
    assert stats.inbound_failed == 1 and stats.inbound_ignored == 1 and stats.inbound_accepted == 0


def _read(settings: Settings, topic: str, partition: int, high: int) -> list[tuple[bytes, int]]:
    """Values and timestamps of `topic[partition]` below `high`."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"r-{uuid.uuid4()}",
                         "enable.auto.commit": False, "log_level": 3})
    consumer.assign([TopicPartition(topic, partition, 0)])
    found: list[tuple[bytes, int]] = []
    deadline = time.monotonic() + 10
    while len(found) < high and time.monotonic() < deadline:
        for msg in consumer.consume(100, timeout=0.2):
            if msg.error() is None and (msg.offset() or 0) < high:
                found.append((msg.value() or b"", msg.timestamp()[1]))
    consumer.close()
    return found


def _high(settings: Settings, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "watermarks",
                         "log_level": 3})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(settings.partitions)}
    finally:
        consumer.close()


@pytest.mark.kafka
async def test_refused_requests_write_nothing_and_a_turn_is_durable_before_its_200(
        settings: Settings) -> None:
    """Unsigned, stale or wrongly signed requests write nothing; a 200 means the turn is in Kafka."""
    ensure_connector_topics(settings, 86_400_000)
    app, stats = _app(settings)
    async with TestClient(TestServer(app)) as client:
        payload = _event("C7", "is this durable?")
        body = json.dumps(payload).encode()
        refused = [
            {"Content-Type": "application/json"},  # unsigned
            _headers(body, secret="not-the-secret"),
            _headers(body, at=time.time() - 301),  # stale
            _headers(body, at=time.time() + 301),
            {**_headers(body), "X-Slack-Signature": slack_signature(SIGNING_SECRET, "1", body)},
        ]
        for headers in refused:
            assert (await client.post("/slack/events", data=body, headers=headers)).status == 401
        tampered = body.replace(b"durable", b"durabke")
        assert (await client.post("/slack/events", data=tampered, headers=_headers(body))).status == 401
        assert stats.inbound_refused == 6
        assert sum(_high(settings, settings.topics.commands).values()) == 0
        assert sum(_high(settings, audit_topic(settings)).values()) == 0

        response = await client.post("/slack/events", data=body, headers=_headers(body))
        assert response.status == 200
        # Sampled after the 200: the turn is already below the high watermarks.
        commands, audits = _high(settings, settings.topics.commands), _high(settings, audit_topic(settings))
    (partition,) = [p for p, high in commands.items() if high > 0]
    assert audits[partition] == 1, "the audit record is on the thread's partition"
    written = [CODEC.decode_command(v)[1] for v, _ in _read(settings, settings.topics.commands, partition,
                                                      commands[partition])]
    assert [type(c) for c in written] == [CreateThread, PostUserMessage]
    post = written[1]
    assert isinstance(post, PostUserMessage)
    assert post.message_id == message_id_for("T0TEST", "C7", payload["event"]["ts"])
    assert post.text == "is this durable?"
    ((audit_value, audit_at),) = _read(settings, audit_topic(settings), partition, 1)
    audit = decode_audit(audit_value)
    assert audit.kind is AuditKind.INBOUND_EVENT and audit.thread_id == post.thread_id
    assert json.loads(audit.detail_json)["event_id"] == payload["event_id"]
    command_times = [t for _, t in _read(settings, settings.topics.commands, partition, 2)]
    assert audit_at <= min(command_times), "the authorizing record was written first"
