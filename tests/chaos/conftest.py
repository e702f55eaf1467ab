"""A live stack for the bad-input tests: processor, worker and gateway as processes on
the session broker, the gateway on 127.0.0.1 over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from streams.config import Settings
from streams.devtools.broker import free_port
from streams.testing.process import RoleProcess
from streams.testing.stack import fresh_env, running_roles, unique_prefix, wait_healthy

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass(frozen=True)
class Live:
    """The live stack: the gateway's base URL, the settings and environment, and the role processes."""
    base: str
    settings: Settings
    env: dict[str, str]
    procs: tuple[RoleProcess, ...]

    def logs(self) -> str:
        """The tail of every process's log, for a failure message."""
        return "\n".join(f"--- {p.role}\n{p.tail()}" for p in self.procs)


@pytest.fixture(scope="module")
def live(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """Processor, worker and gateway processes on fresh topics, gateway healthy, shared by the module."""
    folder: Path = tmp_path_factory.mktemp("live")
    port = free_port()
    env = fresh_env(
        kafka_bootstrap, folder, prefix=unique_prefix("f"), partitions=3,
        THREADLINE_API_KEYS=f"{KEY}=fuzz", THREADLINE_HTTP_PORT=str(port),
        THREADLINE_AGENT_TOKENS_PER_S="200", THREADLINE_AGENT_WORDS="6",
        THREADLINE_DECISION_TIMEOUT_S="5",
        # The fuzzers post hundreds of requests a second as one tenant; the tests after
        # them must still create threads (tests/gateway/test_gateway_limits.py tests the rate).
        THREADLINE_TENANT_POSTS_PER_S="0")
    with running_roles(env, folder, ("processor", "worker", "gateway")) as procs:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(f"{base}/healthz")
        yield Live(base, Settings.from_env(env), env, tuple(procs))
