"""A live stack for the bad-input tests: processor, worker and gateway as processes on
the session broker, the gateway on 127.0.0.1 over real HTTP."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from streams.config import Settings
from streams.devbroker import free_port
from streams.testing.process import RoleProcess
from streams.topics import ensure_topics

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass(frozen=True)
class Live:
    base: str
    settings: Settings
    env: dict[str, str]
    procs: tuple[RoleProcess, ...]

    def logs(self) -> str:
        return "\n".join(f"--- {p.role}\n{p.tail()}" for p in self.procs)


def _wait_healthy(url: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} not healthy in {timeout}s")


@pytest.fixture(scope="module")
def live(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    folder: Path = tmp_path_factory.mktemp("live")
    port = free_port()
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "THREADLINE_TOPIC_PREFIX": f"f{uuid.uuid4().hex[:10]}.",
        "THREADLINE_PARTITIONS": "3",
        "THREADLINE_DATA_DIR": str(folder / "data"),
        "THREADLINE_SESSION_TIMEOUT_S": "6",
        "THREADLINE_API_KEYS": f"{KEY}=fuzz",
        "THREADLINE_HTTP_PORT": str(port),
        "THREADLINE_AGENT_TOKENS_PER_S": "200",
        "THREADLINE_AGENT_WORDS": "6",
        "THREADLINE_DECISION_TIMEOUT_S": "5",
        # The fuzzers post hundreds of requests a second as one tenant; the tests after
        # them must still create threads (tests/gateway/test_gateway_limits.py tests the rate).
        "THREADLINE_TENANT_POSTS_PER_S": "0",
    }
    settings = Settings.from_env(env)
    ensure_topics(settings)
    procs = tuple(RoleProcess(role, env, folder / f"{role}.log").start()
                  for role in ("processor", "worker", "gateway"))
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(f"{base}/healthz")
        yield Live(base, settings, env, procs)
    finally:
        for proc in reversed(procs):
            proc.stop()
