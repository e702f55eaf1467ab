"""A stack of real role processes with their metrics ports (and optionally an OTLP
endpoint), and Debian's Prometheus server, for the observability tests.

`prometheus_binary()` finds `prometheus`; where it is missing it installs Debian's
package with apt-get when it can (root, as CI runs; `make test` installs it first too),
else the test is skipped, except under `CI=true`, where a missing Prometheus fails
the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from streams.config import Settings
from streams.devtools.broker import free_port
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess
from streams.testing.stack import fresh_env, unique_prefix, wait_healthy

__all__ = ["KEY", "ObservedStack", "Prometheus", "observed_stack", "prometheus_binary"]

KEY = "obs-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def prometheus_binary() -> str:
    """The `prometheus` server's path: installed with apt-get if missing and possible;
    a skip without it, or a failure under CI=true."""
    path = shutil.which("prometheus")
    if path is None and shutil.which("apt-get") and os.geteuid() == 0:
        with open("/tmp/threadline-apt.lock", "w") as guard:  # concurrent test sessions
            fcntl.flock(guard, fcntl.LOCK_EX)
            if shutil.which("prometheus") is None:
                for command in (["apt-get", "install", "-y", "-q", "prometheus"],
                                ["apt-get", "update", "-q"],
                                ["apt-get", "install", "-y", "-q", "prometheus"]):
                    done = subprocess.run(command, capture_output=True, timeout=600, check=False,
                                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
                    if command[1] == "install" and done.returncode == 0:
                        break
        path = shutil.which("prometheus")
    if path is None:
        message = "Debian's prometheus package is not installed (apt-get install prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message}: make test installs it (infra/system-deps.sh)")
        pytest.skip(message)
    return path


@dataclass
class ObservedStack:
    """The running roles, the gateway's base URL and every role's metrics address."""

    base: str
    env: dict[str, str]
    roles: dict[str, RoleProcess]
    metrics: dict[str, str]  # role -> host:port serving /metrics

    def logs(self) -> str:
        """The tail of each role's log."""
        return "\n".join(f"--- {name}\n{role.tail()}" for name, role in self.roles.items())


@contextlib.contextmanager
def observed_stack(bootstrap: str, folder: Path, *, webhook_url: str | None = None,
                   **extra: str) -> Iterator[ObservedStack]:
    """Processor, worker and gateway as processes (and a connector posting completed
    runs to `webhook_url`, if given), each with its metrics port, the gateway healthy;
    stopped (SIGTERM, so their last spans are exported) on the way out."""
    port = free_port()
    env = fresh_env(bootstrap, folder, prefix=unique_prefix("o"), THREADLINE_API_KEYS=f"{KEY}=tenant-o",
                    THREADLINE_HTTP_PORT=str(port), THREADLINE_DECISION_TIMEOUT_S="10",
                    THREADLINE_AGENT_TOKENS_PER_S="200", THREADLINE_AGENT_WORDS="20",
                    THREADLINE_AGENT_STEPS="1")
    env.update(extra)
    ensure_topics(Settings.from_env(env))
    metrics = {"gateway": f"127.0.0.1:{port}"}
    roles: dict[str, RoleProcess] = {}
    try:
        names = ("processor", "worker", "gateway") + (("connector",) if webhook_url else ())
        for name in names:
            role_env = dict(env)
            if name == "connector":
                assert webhook_url is not None
                role_env.update(THREADLINE_WEBHOOK_URL=webhook_url, THREADLINE_WEBHOOK_SECRET="obs",
                                THREADLINE_CONNECTOR_HTTP_PORT=str(free_port()),
                                THREADLINE_DATA_DIR=str(folder / "connector"))
            if name != "gateway":
                metrics_port = free_port()
                role_env["THREADLINE_METRICS_PORT"] = str(metrics_port)
                metrics[name] = f"127.0.0.1:{metrics_port}"
            roles[name] = RoleProcess(name, role_env, folder / f"{name}.log").start()
        stack = ObservedStack(f"http://127.0.0.1:{port}", env, roles, metrics)
        wait_healthy(stack.base + "/healthz")
        yield stack
    finally:
        for role in reversed(list(roles.values())):
            role.stop()


class Prometheus:
    """A Prometheus server scraping `targets` every 0.5 s, and its query API."""

    def __init__(self, binary: str, folder: Path, targets: dict[str, str]) -> None:
        self.port = free_port()
        folder.mkdir(parents=True, exist_ok=True)
        scrape = [{"job_name": job, "scrape_interval": "500ms", "scrape_timeout": "400ms",
                   "static_configs": [{"targets": [target]}]} for job, target in targets.items()]
        config = folder / "prometheus.yml"
        config.write_text(json.dumps({"global": {"scrape_interval": "500ms"},
                                      "scrape_configs": scrape}))  # JSON is YAML
        self.argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
        self.log = folder / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        return self

    def __exit__(self, *_: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The result vector of an instant query (GET /api/v1/query)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, promql: str) -> float:
        """The single value of a query (0 if the vector is empty)."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else 0.0

    def wait_value(self, promql: str, predicate: Any, timeout: float = 90.0) -> float:
        """Poll until the query's value satisfies `predicate` (or fail with the last one)."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                value = self.value(promql)
                if predicate(value):
                    return value
            time.sleep(0.25)
        raise AssertionError(f"{promql}: {value} after {timeout}s")
