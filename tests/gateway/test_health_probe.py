"""The /healthz probe against a broker of its own that is killed and restarted: it
reports the outage, then the broker and the group again once they are back (a
cached librdkafka client kept failing here: docs/chaos.md, bug 6)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from gateway.http.health import HealthProbe
from streams.config import Settings
from streams.devtools.broker import EmbeddedKafka
from streams.kafka.topics import ensure_topics

pytestmark = pytest.mark.kafka


async def _until(probe: HealthProbe, group: str, ok: bool, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        report = await probe.probe([group], 2.0)
        members = report["groups"].get(group, {}).get("members", 0)
        if report["broker"]["ok"] == ok and (members >= 1) == ok:
            return report
        assert time.monotonic() < deadline, f"probe still says {report}"
        await asyncio.sleep(0.5)


async def test_probe_sees_a_killed_broker_and_then_its_return(tmp_path: Path) -> None:
    """The health probe reports a killed broker as down and sees it, and the group, come back."""
    broker = EmbeddedKafka(tmp_path / "broker", port=0).start()
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
                                  "THREADLINE_TOPIC_PREFIX": "health.",
                                  "THREADLINE_PARTITIONS": "1"})
    await asyncio.to_thread(ensure_topics, settings)
    group = "health.processor"
    probe = HealthProbe(broker.bootstrap)
    # No offset commits: stopping a member that commits retries its last commit while
    # the group's coordinator loads after the broker's restart (on a loaded machine,
    # past the 30 s its stop was given).
    member = AIOKafkaConsumer(settings.topics.commands, bootstrap_servers=broker.bootstrap,
                              group_id=group, session_timeout_ms=10_000,
                              heartbeat_interval_ms=1_000, enable_auto_commit=False)
    await member.start()
    polling = asyncio.create_task(member.getmany(timeout_ms=600_000))
    try:
        report = await _until(probe, group, True, 30)
        assert report["broker"]["brokers"] == 1
        assert report["groups"][group]["state"] == "stable"

        await asyncio.to_thread(broker.kill)
        down = await _until(probe, group, False, 30)
        assert down["broker"]["error"]

        await asyncio.to_thread(broker.start)
        back = await _until(probe, group, True, 90)
        assert back["groups"][group]["members"] == 1
    finally:
        polling.cancel()
        await probe.close()
        await member.stop()
        await asyncio.to_thread(broker.stop)
