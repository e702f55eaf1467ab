"""GET /healthz: 200 only when the broker answers, the processor and worker groups
have members and the read model is loaded; 503 with what is missing otherwise.
It is liveness: a processor that joined its group may still be restoring its
tables; `/readyz` (`gateway.http.ready`) says whether decisions are being made.

The probe is aiokafka's admin client on the gateway's own loop, not librdkafka's:
librdkafka's `AdminClient` aborted the whole process (an assertion in
`rd_kafka_enq_once_del_source_return`) when a broker of a cluster died under a
probe, and a cached one kept timing out after a broker restart while a fresh one
answered (docs/chaos.md, bugs 6 and 7). A probe that fails drops its client, so
the next one starts afresh."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from gateway.keys import FEED, OPTIONS, READ_MODEL, SETTINGS

__all__ = ["HEALTH", "HealthProbe", "healthz"]


class HealthProbe:
    """Asks the broker about itself and the consumer groups."""

    def __init__(self, bootstrap: str, client_args: Mapping[str, object] | None = None) -> None:
        self.bootstrap = bootstrap
        self.client_args = dict(client_args or {})  # TLS and SASL: streams.kafka.clients
        self._admin: AIOKafkaAdminClient | None = None
        self._lock = asyncio.Lock()  # one probe at a time shares one client

    async def probe(self, groups: list[str], timeout_s: float) -> dict[str, Any]:
        """Report whether the broker answers and how many members each consumer group has."""
        async with self._lock:
            report: dict[str, Any] = {"broker": {"ok": False}, "groups": {}}
            try:
                async with asyncio.timeout(timeout_s):
                    admin = await self._client(timeout_s)
                    cluster = await admin.describe_cluster()
                report["broker"] = {"ok": True, "brokers": len(cluster["brokers"])}
            except Exception as exc:
                report["broker"] = {"ok": False, "error": _describe(exc)}
                await self.close()
                return report
            for group in groups:
                try:
                    async with asyncio.timeout(timeout_s):
                        (response,) = await admin.describe_consumer_groups([group])
                    report["groups"][group] = _group(response)
                except Exception as exc:
                    report["groups"][group] = {"members": 0, "error": _describe(exc)}
                    await self.close()
                    break
            return report

    async def committed(self, group: str, partitions: list[TopicPartition],
                        timeout_s: float) -> dict[TopicPartition, int]:
        """The group's committed offsets on `partitions` (absent: none committed);
        raises if the broker does not answer (and drops the client)."""
        async with self._lock:
            try:
                async with asyncio.timeout(timeout_s):
                    admin = await self._client(timeout_s)
                    found = await admin.list_consumer_group_offsets(group, partitions=partitions)
            except Exception:
                await self.close()
                raise
        return {tp: meta.offset for tp, meta in found.items() if meta.offset >= 0}

    async def _client(self, timeout_s: float) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(**{**self.client_args, "bootstrap_servers": self.bootstrap},
                                        request_timeout_ms=int(timeout_s * 1000))
            try:
                await admin.start()
            except BaseException:
                await admin.close()
                raise
            self._admin = admin
        return self._admin

    async def close(self) -> None:
        """Close the admin client (next probe makes a new one), ignoring errors."""
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):  # closing toward a dead broker may fail too
                await admin.close()


HEALTH = web.AppKey("health", HealthProbe)


def _group(response: Any) -> dict[str, Any]:
    """One group of a DescribeGroups response: its state and member count."""
    (group,) = response.to_object()["groups"]
    if group["error_code"]:
        return {"members": 0, "error": f"error code {group['error_code']}"}
    return {"members": len(group["members"]), "state": group["state"].lower()}


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: broker, consumer groups, read model and feed; 503 unless all are up."""
    app = request.app
    settings = app[SETTINGS]
    groups = [settings.group_id("processor"), settings.group_id("worker")]
    report = await app[HEALTH].probe(groups, app[OPTIONS].health_timeout_s)
    missing = [g for g in groups if report["groups"].get(g, {}).get("members", 0) < 1]
    healthy = report["broker"]["ok"] and not missing and app[READ_MODEL].loaded and \
        app[FEED].started
    report.update(status="ok" if healthy else "unavailable",
                  read_model={k: v for k, v in app[READ_MODEL].stats().items() if k != "store"},
                  feed=app[FEED].stats())
    if missing:
        report["missing_members"] = missing
    return web.json_response(report, status=200 if healthy else 503)
