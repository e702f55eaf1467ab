"""Restate: `restate-server` (npm) with the workload as a Python service (restate-sdk
over hypercorn), registered through the admin API. A run is one call to the ingress
with the run as its `idempotency-key`, so posting it again attaches to the same
invocation."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from pathlib import Path

import aiohttp
from typing_extensions import override

from bench.peers import install
from bench.peers.procs import Proc, free_port, wait_port
from bench.peers.system import System, answered_ok, retry_pause
from bench.peers.workload import SHARED_LOG_ENV

APP = Path(__file__).parent / "apps" / "restate_app.py"
_DURABLE_KEYS = ("default-replication", "default-provider", "rocksdb-disable-wal-fsync",
                 "rocksdb-disable-wal =")


class Restate(System):
    """The Restate server and its Python service, each a process of its own."""

    name = "Restate"
    roles: tuple[str, ...] = ("server", "service")
    turns = False  # a journaled model turn before each tool call

    @override
    async def start(self, session: aiohttp.ClientSession) -> None:
        self.binary = install.restate_server()
        self.python = install.venv_python("restate")
        self.ingress, self.admin, self.node, self.service_port = (free_port() for _ in range(4))
        env = {"RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{self.ingress}",
               "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{self.admin}",
               "RESTATE_BIND_ADDRESS": f"127.0.0.1:{self.node}",
               "RESTATE_ADVERTISED_ADDRESS": f"http://127.0.0.1:{self.node}/",
               "RESTATE_DISABLE_TELEMETRY": "true", "RESTATE_LOG_DISABLE_ANSI_CODES": "true"}
        self.procs["server"] = Proc("restate-server", [
            str(self.binary), "--no-logo", "--listen-mode", "tcp", "--node-name", "peers",
            "--base-dir", str(self.folder / "restate-data")], env,
            self.folder / "restate-server.log").start()
        self.procs["service"] = Proc("restate-service", [
            str(self.python), str(APP), str(self.service_port)],
            {SHARED_LOG_ENV: str(self.tool_log)}, self.folder / "restate-service.log").start()
        procs = list(self.procs.values())
        await asyncio.to_thread(wait_port, self.service_port, 60, procs)
        await asyncio.to_thread(wait_port, self.admin, 60, procs)
        deadline = time.monotonic() + 60
        while True:
            try:
                async with session.post(f"http://127.0.0.1:{self.admin}/deployments",
                                        json={"uri": f"http://127.0.0.1:{self.service_port}"}) as r:
                    if r.status in (200, 201):
                        break
                    last = f"{r.status} {await r.text()}"
            except aiohttp.ClientError as exc:
                last = str(exc)
            if not await retry_pause(deadline, 0.3):
                raise RuntimeError(f"registering the deployment: {last}")
        await self._ingress_ready(session, deadline)

    async def _ingress_ready(self, session: aiohttp.ClientSession, deadline: float) -> None:
        if not await answered_ok(session, "GET", f"http://127.0.0.1:{self.ingress}/restate/health",
                                 deadline):
            raise RuntimeError("the ingress never answered /restate/health")

    @override
    async def run(self, session: aiohttp.ClientSession, slot: str, key: str, delay_s: float,
                  deadline: float, ids: dict[str, str]) -> float | None:
        ids[key] = key
        body = {"run": key, "steps": 4, "delay": delay_s, "turns": self.turns}
        ok = await answered_ok(session, "POST", f"http://127.0.0.1:{self.ingress}/Agent/run",
                               deadline, json=body, headers={"idempotency-key": key})
        return time.time() if ok else None

    @override
    def version(self) -> str:
        server = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True,
                                check=False).stdout.strip()
        sdk = subprocess.run([str(self.python), "-c", "import importlib.metadata as m; "
                              "print(m.version('restate-sdk'))"], capture_output=True, text=True,
                             check=False).stdout.strip()
        return f"{server}, restate-sdk {sdk} (Python, hypercorn, h2c)"

    @override
    def durability(self) -> str:
        dump = subprocess.run([str(self.binary), "--dump-config"], capture_output=True, text=True,
                              check=False).stdout
        seen: list[str] = []
        for line in dump.splitlines():
            if any(line.startswith(k) for k in _DURABLE_KEYS) and line not in seen:
                seen.append(line.strip())
        return ("one node (every role), its own log (bifrost) and partition store in RocksDB; "
                + "; ".join(re.sub(r"\s+", " ", s) for s in seen))

    @override
    def settings(self) -> str:
        return ("shipped defaults; ports moved off 8080/9070/5122, telemetry off; "
                "the service's hypercorn as the SDK's harness configures it")


class RestateTurns(Restate):
    """Restate journaling a model turn before each tool call, as Threadline's builtin
    agent does (two journal entries a call): the workload's durable steps matched."""

    name = "Restate, model turn + call"
    roles = ()
    turns = True
