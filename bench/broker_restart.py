"""A broker restart under `threadline run` (issue #23): how long runs stall after the
embedded broker is killed with SIGKILL and `threadline run`'s supervisor starts it
again on the same data.

    python -m bench.broker_restart [--runs 20] [--repeat 1]

`threadline run` (the embedded broker, the processor, the worker and the gateway,
with the shipped defaults apart from the peers benchmark's raised limits) runs in a
fresh folder under var/. The peers' workload (bench/peers/workload.py: runs of 4
tool calls of 0.2 s, the side-effect log) puts `--runs` runs in flight; once each
has begun a call, the broker's JVM is killed. Reported, from the kill and from the
moment the broker serves again (its controller known to a client):

- broker up: the supervisor's restart plus the broker's own start and log recovery;
- serving again: the first call begun after the kill;
- runs moving again: every run in flight at the kill began a call after it, or answered;
- every run done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from confluent_kafka.admin import AdminClient
from typing_extensions import override

from bench.common import VAR
from bench.peers.driver import Size, load_text, recovery
from bench.peers.procs import Proc, free_port, tree_pids
from bench.peers.threadline import RAISED, Threadline
from streams.devtools.broker import KAFKA_VERSION

DELAY_S = 0.2


class ThreadlineRun(Threadline):
    """`threadline run` as one process tree; the role killed is its broker."""

    name = "Threadline (threadline run)"
    roles = ("broker",)
    lost_roles = ()

    @override
    async def start(self, session: aiohttp.ClientSession) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port, self.kafka_port = free_port(), free_port()
        self.env = {
            "THREADLINE_KAFKA_PORT": str(self.kafka_port), "THREADLINE_HTTP_PORT": str(self.port),
            "THREADLINE_DATA_DIR": str(self.folder / "data"), "THREADLINE_API_KEYS": "bench=bench",
            "THREADLINE_TOPIC_PREFIX": f"r{uuid.uuid4().hex[:8]}.",
            "THREADLINE_METRICS_PORT": str(free_port()),
            **RAISED, "THREADLINE_AGENT_TOOLS": "4", "THREADLINE_AGENT_TOKENS_PER_S": "0",
            "THREADLINE_AGENT_TOOL_DELAY_S": str(DELAY_S),
            "THREADLINE_AGENT_TOOL_LOG": str(self.tool_log),
        }
        self.env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
        environ = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
        self.run_proc = Proc("threadline-run", [sys.executable, "-m", "streams.cli", "run"],
                             {**environ, **self.env}, self.folder / "run.log").start()
        self.children = {}
        self.broker_up_ms: float | None = None
        await self._healthy(session, timeout=180)

    @override
    async def set_delay(self, session: aiohttp.ClientSession, delay_s: float) -> None:
        assert delay_s == DELAY_S, "the tools' delay is set when `threadline run` starts"

    @override
    def roots(self) -> dict[str, int]:
        return {"threadline run": self.run_proc.pid} if self.run_proc.alive() else {}

    def _broker_pid(self) -> int:
        for pid in tree_pids([self.run_proc.pid]):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"kafka.Kafka" in cmdline:
                return pid
        raise RuntimeError("no broker JVM under threadline run")

    @override
    async def kill(self, role: str) -> None:
        assert role == "broker"
        os.kill(self._broker_pid(), signal.SIGKILL)
        killed = time.time()
        threading.Thread(target=self._until_broker_up, args=(killed,), daemon=True).start()

    def _until_broker_up(self, killed: float) -> None:
        """When the restarted broker answers with a controller (a client's view)."""
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{self.kafka_port}", "log_level": 0,
                             "reconnect.backoff.max.ms": 100})
        time.sleep(0.3)  # past the dead broker's last answers
        while time.time() - killed < 300:
            try:
                metadata = admin.list_topics(timeout=1)
                if metadata.brokers and metadata.controller_id >= 0:
                    self.broker_up_ms = time.time() * 1000
                    return
            except Exception:  # still down
                pass
            time.sleep(0.05)

    @override
    async def restart(self, role: str) -> None:
        """Nothing: `threadline run`'s supervisor restarts its broker."""

    @override
    async def stop(self) -> None:
        await asyncio.to_thread(self.run_proc.stop, 60)

    @override
    def serving_again(self, role: str, kill_ms: float) -> float | None:
        return None  # the first call begun after the kill

    @override
    def milestones(self, role: str, kill_ms: float) -> dict[str, float]:
        return {}

    @override
    def version(self) -> str:
        return f"{super().version()}; threadline run, Kafka {KAFKA_VERSION}"


async def measure(folder: Path, runs: int) -> dict[str, Any]:
    """One `threadline run`, one broker kill; the figures."""
    system = ThreadlineRun(folder)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as session:
        try:
            await system.start(session)
            size = Size(inflight=runs, delay=DELAY_S)
            rec = await recovery(system, session, "broker", size)
        finally:
            await system.stop()
    up = system.broker_up_ms
    rec["broker up s"] = None if up is None else (up - rec["killed at ms"]) / 1000
    for key in ("serving again s", "runs moving again s", "every run done s"):
        after = rec.get(key)
        rec[f"{key[:-2]} after the broker is up s"] = \
            None if after is None or up is None else after - rec["broker up s"]
    return rec


def main() -> None:
    """Measure, print and save (var/broker-restart-results.json)."""
    parser = argparse.ArgumentParser(prog="python -m bench.broker_restart", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    results = []
    for i in range(args.repeat):
        folder = VAR / f"broker-restart-{time.strftime('%H%M%S')}-{i}"
        print(f"load before: {load_text()}", flush=True)
        results.append(asyncio.run(measure(folder, args.runs)))
        print(json.dumps(results[-1], indent=1), flush=True)
    VAR.mkdir(exist_ok=True)
    (VAR / "broker-restart-results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
