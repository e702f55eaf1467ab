"""GET /readyz: 200 only when decisions are being made.

`/healthz` says the roles are alive: a processor that has joined its group counts,
although it may still be restoring its tables and decide nothing for a while (a
POST then gets `202 pending`). Readiness asks the processor itself: the probe
writes a `CheckDeadlines` command to every partition of the commands topic, for a
synthetic thread id that hashes to that partition (Kafka's murmur2, like every
key), and is ready once the processor group's committed offset on each partition
has passed its probe. A committed offset past the probe means an owner of the
partition restored it and processed the probe, so it decides what comes next.
A `CheckDeadlines` on a thread that does not exist decides nothing and writes
nothing but the group's offset.

Load balancers poll this often, so a success is cached for `ready_cache_s`, and a
probe still waiting on a partition is not written again (at most one a partition
a minute while the processor is away); at most one check runs at a time.
Also required: the gateway's read model has loaded (it serves the reads).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web
from aiokafka import TopicPartition

from gateway.http.health import HealthProbe
from gateway.kafka import partition_for
from gateway.keys import FEED
from gateway.model.decisions import CommandBus
from gateway.model.read_model import ReadModel
from streams.clock import now_ms
from streams.config import Settings
from streams.core.domain import CheckDeadlines

__all__ = ["READY", "Readiness", "probe_thread_id", "readyz"]

log = logging.getLogger("threadline.gateway")

REPROBE_S = 60.0  # a probe older than this unanswered is written again
_POLL_S = 0.05
PROBE_TENANT = "_readyz"


def probe_thread_id(partition: int, partitions: int) -> str:
    """A thread id no client makes, whose records go to `partition`."""
    n = 0
    while partition_for(f"_readyz-{partition}-{n}", partitions) != partition:
        n += 1
    return f"_readyz-{partition}-{n}"


class Readiness:
    """Whether the processor answers: a probe command on every partition, cached while it passes."""
    def __init__(self, settings: Settings, bus: CommandBus, health: HealthProbe,
                 read_model: ReadModel, *, timeout_s: float = 2.0,
                 cache_s: float = 5.0) -> None:
        self.settings, self.bus, self.health, self.read_model = \
            settings, bus, health, read_model
        self.timeout_s, self.cache_s = timeout_s, cache_s
        self.group = f"{settings.topic_prefix}processor"
        self.thread_ids = [probe_thread_id(p, settings.partitions)
                           for p in range(settings.partitions)]
        self._outstanding: dict[int, tuple[int, float]] = {}  # partition -> offset, when
        self._ready_until = 0.0
        self._lock = asyncio.Lock()
        self.first_ready_at: float | None = None  # monotonic
        self.probes_written = 0

    async def check(self) -> tuple[bool, dict[str, Any]]:
        """Ready (with a report) once every partition's probe is decided; cached for cache_s."""
        if time.monotonic() < self._ready_until:
            return True, {"cached": True}
        async with self._lock:
            if time.monotonic() < self._ready_until:  # a check that ran meanwhile
                return True, {"cached": True}
            return await self._check()

    async def _check(self) -> tuple[bool, dict[str, Any]]:
        report: dict[str, Any] = {"cached": False, "read_model_loaded": self.read_model.ready}
        try:
            await self._write_probes()
        except Exception as exc:
            report["error"] = f"probe not written: {exc}"
            return False, report
        deadline = time.monotonic() + self.timeout_s
        topic = self.settings.topics.commands
        waiting = sorted(self._outstanding)
        while True:
            try:
                committed = await self.health.committed(
                    self.group, [TopicPartition(topic, p) for p in waiting],
                    max(0.1, deadline - time.monotonic()))
            except Exception as exc:
                report["error"] = f"committed offsets unknown: {exc or type(exc).__name__}"
                committed = {}
            for p in list(waiting):
                if committed.get(TopicPartition(topic, p), -1) > self._outstanding[p][0]:
                    del self._outstanding[p]
                    waiting.remove(p)
            if not waiting or time.monotonic() >= deadline:
                break
            await asyncio.sleep(_POLL_S)
        report["partitions_waiting"] = waiting
        ready = not waiting and self.read_model.ready
        if ready:
            self._ready_until = time.monotonic() + self.cache_s
            if self.first_ready_at is None:
                self.first_ready_at = time.monotonic()
                log.info("ready: the processor decides on every partition")
        return ready, report

    async def _write_probes(self) -> None:
        now = time.monotonic()
        for partition in range(self.settings.partitions):
            pending = self._outstanding.get(partition)
            if pending is not None and now - pending[1] < REPROBE_S:
                continue
            thread_id = self.thread_ids[partition]
            command = CheckDeadlines(thread_id, now_ms())
            written, offset = await self.bus.publish(command, PROBE_TENANT, None)
            assert written == partition, (written, partition)
            self._outstanding[partition] = (offset, now)
            self.probes_written += 1


READY = web.AppKey("ready", Readiness)


async def readyz(request: web.Request) -> web.Response:
    """GET /readyz: 200 once the processor answers on every partition and the feed runs."""
    ready, report = await request.config_dict[READY].check()
    ready = ready and request.config_dict[FEED].started  # /v1 answers 503 until the feed runs
    report["status"] = "ready" if ready else "unavailable"
    return web.json_response(report, status=200 if ready else 503)
