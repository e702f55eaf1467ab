"""GET /healthz: 200 only when the broker answers and the processor and worker groups
have members; 503 with what is missing otherwise."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from confluent_kafka.admin import AdminClient

from gateway.keys import FEED, OPTIONS, READ_MODEL, SETTINGS

__all__ = ["HEALTH", "HealthProbe", "healthz"]


class HealthProbe:
    """Asks the broker about itself and the consumer groups (blocking; run in a thread)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._admin: AdminClient | None = None  # made on first use: it starts threads

    def probe(self, groups: list[str], timeout_s: float) -> dict[str, Any]:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        return _probe(self._admin, groups, timeout_s)


HEALTH = web.AppKey("health", HealthProbe)


def _probe(admin: AdminClient, groups: list[str], timeout_s: float) -> dict[str, Any]:
    report: dict[str, Any] = {"broker": {"ok": False}, "groups": {}}
    try:
        metadata = admin.list_topics(timeout=timeout_s)
        report["broker"] = {"ok": True, "brokers": len(metadata.brokers)}
    except Exception as exc:
        report["broker"] = {"ok": False, "error": str(exc)}
        return report
    futures = admin.describe_consumer_groups(groups, request_timeout=timeout_s)
    for group, future in futures.items():
        try:
            description = future.result(timeout=timeout_s)
            report["groups"][group] = {"members": len(description.members),
                                       "state": description.state.name.lower()}
        except Exception as exc:
            report["groups"][group] = {"members": 0, "error": str(exc)}
    return report


async def healthz(request: web.Request) -> web.Response:
    app = request.app
    prefix = app[SETTINGS].topic_prefix
    groups = [f"{prefix}processor", f"{prefix}worker"]
    timeout_s = app[OPTIONS].health_timeout_s
    try:
        report = await asyncio.wait_for(
            asyncio.to_thread(app[HEALTH].probe, groups, timeout_s), timeout_s * 3)
    except TimeoutError:
        report = {"broker": {"ok": False, "error": "timed out"}, "groups": {}}
    missing = [g for g in groups if report["groups"].get(g, {}).get("members", 0) < 1]
    healthy = report["broker"]["ok"] and not missing and app[READ_MODEL].loaded
    report.update(status="ok" if healthy else "unavailable",
                  read_model={"loaded": app[READ_MODEL].loaded}, feed=app[FEED].stats())
    if missing:
        report["missing_members"] = missing
    return web.json_response(report, status=200 if healthy else 503)
