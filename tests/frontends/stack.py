"""A whole Threadline stack as separate processes (processor, worker, gateway) on the
session broker, so a test can `kill -9` the gateway or the worker under a client.

Shared by the AI SDK test (tests/frontends) and the console test (tests/browser)."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.devtools.broker import free_port
from streams.testing.process import RoleProcess, logs_of
from streams.testing.stack import fresh_env, running_roles, unique_prefix, wait_healthy

__all__ = ["KEY", "ProcessStack", "process_stack"]

KEY = "console-key"


def _env(bootstrap: str, folder: Path, port: int, extra: dict[str, str]) -> dict[str, str]:
    return {**fresh_env(
        bootstrap, folder, prefix=unique_prefix("f"),
        THREADLINE_API_KEYS=f"{KEY}=tenant-f",
        THREADLINE_HTTP_PORT=str(port),
        THREADLINE_DECISION_TIMEOUT_S="10",
        # Normal answers take about a second; "[slow]" ones long enough (~15 s) for a
        # kill and a restart to land in the middle of them.
        THREADLINE_AGENT_TOKENS_PER_S="40",
        THREADLINE_AGENT_SLOW_TOKENS_PER_S="4",
        THREADLINE_AGENT_WORDS="50",
        THREADLINE_AGENT_STEPS="1",
        # A killed worker's attempt is rescheduled within seconds, with heartbeats to see.
        THREADLINE_HEARTBEAT_INTERVAL_S="1",
        THREADLINE_HEARTBEAT_TIMEOUT_S="4",
        THREADLINE_RETRY_INITIAL_S="0.5",
        THREADLINE_MAX_ATTEMPTS="3",
    ), **extra}


@dataclass
class ProcessStack:
    """The running roles and the gateway's base URL."""

    base: str
    env: dict[str, str]
    processor: RoleProcess
    worker: RoleProcess
    gateway: RoleProcess

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> \
            tuple[int, Any]:
        """One JSON request with the key: status and body."""
        request = urllib.request.Request(
            self.base + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def progress(self) -> tuple[int, ...]:
        """Grows while the roles work (their logs): a wait's progress."""
        return logs_of(self.processor.log, self.worker.log, self.gateway.log)()

    def restart(self, role: RoleProcess) -> None:
        """`kill -9` the role's process and start it again (the gateway: until healthy)."""
        role.kill9()
        role.start()
        if role is self.gateway:
            wait_healthy(self.base + "/healthz")

    def events(self, path: str) -> list[tuple[str, dict[str, Any]]]:
        """A run's native SSE events (`/v1/runs/{id}/events`, which ends after the run
        does): (name, data) of each."""
        request = urllib.request.Request(self.base + path,
                                         headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read().decode()
        events = []
        for frame in body.split("\n\n"):
            lines = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
            if "event" in lines and lines.get("data", "").startswith("{"):
                events.append((lines["event"], json.loads(lines["data"])))
        return events

    def retries(self, run_id: str) -> list[tuple[int, str]]:
        """The run's failed attempts and why, from its `retry_scheduled` events."""
        return [(data["attempt"], data.get("detail", "")) for name, data in
                self.events(f"/v1/runs/{run_id}/events") if name == "retry_scheduled"]

    def logs(self) -> str:
        """The tail of each role's log."""
        return "\n".join(f"--- {r.role}\n{r.tail()}"
                         for r in (self.processor, self.worker, self.gateway))


@contextlib.contextmanager
def process_stack(bootstrap: str, folder: Path, **extra: str) -> Iterator[ProcessStack]:
    """The three roles, healthy, stopped after; `extra` settings override the module's."""
    port = free_port()
    env = _env(bootstrap, folder, port, extra)
    with running_roles(env, folder, ("processor", "worker", "gateway")) as roles:
        stack = ProcessStack(f"http://127.0.0.1:{port}", env, *roles)
        wait_healthy(stack.base + "/healthz")
        yield stack
