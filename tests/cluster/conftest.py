"""Three gateway processes behind HAProxy (round robin, no affinity), with a processor
and a worker, on the session broker: the deployment issue #26 asks clients to keep
working through while one gateway is killed with SIGKILL."""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.kafka import partition_for
from streams.config import Settings
from streams.devtools.broker import free_port
from streams.testing.haproxy import HAProxy, haproxy_binary
from streams.testing.process import RoleProcess, logs_of, wait_for
from streams.testing.stack import fresh_env, running_roles, unique_prefix
from tests.frontends.stack import KEY as FRONTENDS_KEY

KEY = FRONTENDS_KEY  # the key the Node scripts send (tests/frontends/stack.py)
TENANT = "tenant-c"
GATEWAYS = 3


def _need_haproxy() -> None:
    if haproxy_binary() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("no haproxy on this machine: make test installs Debian's "
                        "(infra/system-deps.sh)", pytrace=False)
        pytest.skip("haproxy is not installed (apt-get install haproxy)")


def get_json(url: str, timeout: float = 10) -> tuple[int, Any]:
    """GET `url` with the key: status and JSON body (None if not JSON)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


@dataclass
class Cluster:
    """The running processes; clients use `base` (HAProxy)."""

    env: dict[str, str]
    partitions: int
    ports: list[int]
    gateways: list[RoleProcess]
    haproxy: HAProxy

    @property
    def base(self) -> str:
        """HAProxy's URL."""
        return self.haproxy.base

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> \
            tuple[int, Any]:
        """One JSON request through HAProxy with the key: status and body."""
        request = urllib.request.Request(
            self.base + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def owned(self, index: int) -> list[int] | None:
        """The partitions gateway `index` serves, from its /livez (None if it does not answer)."""
        try:
            _, report = get_json(f"http://127.0.0.1:{self.ports[index]}/livez", timeout=5)
        except OSError:
            return None
        owned = (report or {}).get("owned")
        return owned if isinstance(owned, list) else None

    def split(self) -> bool:
        """Whether the live gateways own every partition between them, each a share."""
        shares = [self.owned(i) for i, g in enumerate(self.gateways) if g.alive()]
        if any(share is None or not share for share in shares):
            return False
        return sorted(p for share in shares for p in share or []) == list(range(self.partitions))

    def shares(self) -> list[list[int] | None]:
        """Each gateway's partitions as its /livez says (the progress of a rebalance)."""
        return [self.owned(i) for i in range(len(self.gateways))]

    def settle(self) -> None:
        """Until the live gateways own every partition between them; bounded by
        progress (the shares changing), not by the clock."""
        wait_for(self.split, timeout=120, progress=self.shares)

    def owner(self, thread_id: str) -> int:
        """The index of the live gateway that owns the thread's partition now."""
        partition = partition_for(thread_id, self.partitions)

        def found() -> int | None:  # the index + 1: gateway 0 must be truthy
            return next((i + 1 for i, g in enumerate(self.gateways)
                         if g.alive() and partition in (self.owned(i) or ())), None)

        index = wait_for(found, timeout=60, progress=self.shares)
        assert index is not None  # wait_for returns a true value
        return index - 1

    def logs(self) -> str:
        """The tail of each gateway's log, and HAProxy's."""
        haproxy = self.haproxy.log.read_text(errors="replace").splitlines()[-40:] \
            if self.haproxy.log.exists() else []
        return "\n".join([*(f"--- {g.name}\n{g.tail(150)}" for g in self.gateways),
                          "--- haproxy", *haproxy])


@contextlib.contextmanager
def running_cluster(bootstrap: str, folder: Path, *, owner_routing: bool = False,
                    **extra: str) -> Iterator[Cluster]:
    """The roles, three grouped gateways and HAProxy (round robin, or with
    `owner_routing` deploy/haproxy/threadline.lua's), split and serving; stopped after."""
    _need_haproxy()
    env = {**fresh_env(bootstrap, folder, prefix=unique_prefix("c"),
                       THREADLINE_API_KEYS=f"{KEY}={TENANT}", THREADLINE_DECISION_TIMEOUT_S="10",
                       THREADLINE_AGENT_TOKENS_PER_S="40", THREADLINE_AGENT_WORDS="30"), **extra}
    ports = [free_port() for _ in range(GATEWAYS)]
    gateways = [RoleProcess("gateway", {**env, "THREADLINE_HTTP_PORT": str(port),
                                        "THREADLINE_GATEWAY_URL": f"http://127.0.0.1:{port}"},
                            folder / f"gateway-{n}.log", name=f"gateway-{n}")
                for n, port in enumerate(ports)]
    haproxy = HAProxy(free_port(), ports, folder / "haproxy", owner_routing=owner_routing)
    with running_roles(env, folder, ("processor", "worker")):
        try:
            for gateway in gateways:
                gateway.start()
            haproxy.start()
            cluster = Cluster(env, Settings.from_env(env).partitions, ports, gateways, haproxy)
            cluster.settle()
            haproxy.wait_serving(progress=logs_of(*(g.log for g in gateways)))
            yield cluster
        finally:
            haproxy.stop()
            for gateway in gateways:
                gateway.stop()


@pytest.fixture
def cluster(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Cluster]:
    """A fresh cluster of three gateways behind HAProxy for one test."""
    with running_cluster(kafka_bootstrap, tmp_path) as running:
        yield running
