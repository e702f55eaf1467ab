"""A whole Threadline stack as separate processes (processor, worker, gateway) on the
session broker, so a test can `kill -9` the gateway or the worker under a client.

Shared by the AI SDK test (tests/frontends) and the console test (tests/browser)."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streams.broker import free_port
from streams.config import Settings
from streams.topics import ensure_topics
from tests.kafka_helpers import RoleProcess, wait_for

__all__ = ["KEY", "ProcessStack", "process_stack"]

KEY = "console-key"


def _env(bootstrap: str, folder: Path, port: int) -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "THREADLINE_TOPIC_PREFIX": f"f{uuid.uuid4().hex[:10]}.",
        "THREADLINE_PARTITIONS": "4",
        "THREADLINE_DATA_DIR": str(folder / "data"),
        "THREADLINE_SESSION_TIMEOUT_S": "6",
        "THREADLINE_API_KEYS": f"{KEY}=tenant-f",
        "THREADLINE_HTTP_PORT": str(port),
        "THREADLINE_DECISION_TIMEOUT_S": "10",
        # Normal answers take about a second; "[slow]" ones long enough (~15 s) for a
        # kill and a restart to land in the middle of them.
        "THREADLINE_AGENT_TOKENS_PER_S": "40",
        "THREADLINE_AGENT_SLOW_TOKENS_PER_S": "4",
        "THREADLINE_AGENT_WORDS": "50",
        "THREADLINE_AGENT_STEPS": "1",
        # A killed worker's attempt is rescheduled within seconds, with heartbeats to see.
        "THREADLINE_HEARTBEAT_INTERVAL_S": "1",
        "THREADLINE_HEARTBEAT_TIMEOUT_S": "4",
        "THREADLINE_RETRY_INITIAL_S": "0.5",
        "THREADLINE_MAX_ATTEMPTS": "3",
    }


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

    def healthy(self) -> bool:
        """Whether /healthz answers 200."""
        try:
            with urllib.request.urlopen(self.base + "/healthz", timeout=5) as response:
                return response.status == 200
        except Exception:
            return False

    def restart(self, role: RoleProcess) -> None:
        """`kill -9` the role's process and start it again (the gateway: until healthy)."""
        role.kill9()
        role.start()
        if role is self.gateway:
            wait_for(self.healthy, timeout=90)

    def logs(self) -> str:
        """The tail of each role's log."""
        return "\n".join(f"--- {r.role}\n{r.tail()}"
                         for r in (self.processor, self.worker, self.gateway))


@contextlib.contextmanager
def process_stack(bootstrap: str, folder: Path) -> Iterator[ProcessStack]:
    """The three roles, healthy, stopped after."""
    port = free_port()
    env = _env(bootstrap, folder, port)
    ensure_topics(Settings.from_env(env))
    roles = [RoleProcess(name, env, folder / f"{name}.log").start()
             for name in ("processor", "worker", "gateway")]
    stack = ProcessStack(f"http://127.0.0.1:{port}", env, *roles)
    try:
        wait_for(stack.healthy, timeout=90)
        yield stack
    finally:
        for role in reversed(roles):
            role.stop()
