"""The stack under test: its own broker (or cluster), and every role as a process.

Two processors, two workers and two gateways (or more) run as `threadline <role>`
subprocesses with short timeouts, so that a `kill -9` is noticed and recovered
from within seconds. Balanced (the gateways preset), the gateways form one group and
clients reach them through HAProxy only. The broker belongs to the chaos run alone (an embedded one
on free ports), so restarting it harms no other test; with
`KAFKA_BOOTSTRAP_SERVERS` given it uses that cluster and never restarts it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from streams.config import Settings
from streams.devtools.broker import EmbeddedCluster, EmbeddedKafka, free_port
from streams.kafka.faults import FAULT_ENV
from streams.kafka.topics import ensure_topics
from streams.testing.haproxy import HAProxy
from streams.testing.process import RoleProcess, logs_of
from streams.testing.stack import fresh_env, unique_prefix

__all__ = ["API_KEY", "ROLES", "Proc", "Stack", "chaos_env"]

Proc = RoleProcess  # one role process of the run, killed with SIGKILL and restarted

API_KEY = "chaos-key"
ROLES = ("processor", "worker", "gateway")


def chaos_env(bootstrap: str, folder: Path, replication: int) -> dict[str, str]:
    """Short timeouts everywhere: a dead process is noticed within seconds."""
    return fresh_env(bootstrap, folder, prefix=unique_prefix("chaos", 8), partitions=6, **{
        "THREADLINE_REPLICATION_FACTOR": str(replication),
        "THREADLINE_API_KEYS": f"{API_KEY}=chaos",
        # The load is one tenant standing for many: no per-tenant limits.
        "THREADLINE_TENANT_MAX_STREAMS": "0", "THREADLINE_TENANT_MAX_REPLAYS": "0",
        "THREADLINE_TENANT_POSTS_PER_S": "0", "THREADLINE_TENANT_MAX_ACTIVE_RUNS": "0",
        "THREADLINE_HEARTBEAT_INTERVAL_S": "0.5",
        "THREADLINE_HEARTBEAT_TIMEOUT_S": "4.5",
        "THREADLINE_RETRY_INITIAL_S": "0.2",
        "THREADLINE_RETRY_MAX_S": "2",
        # Enough attempts that no run fails for want of them: a kill is not an answer.
        "THREADLINE_MAX_ATTEMPTS": "12",
        "THREADLINE_DECISION_TIMEOUT_S": "3",
        "THREADLINE_AGENT_TOKENS_PER_S": "60",
        "THREADLINE_AGENT_SLOW_TOKENS_PER_S": "8",
        "THREADLINE_AGENT_WORDS": "16",
        # Messages marked [tools=2] (chaos.load) call the MCP server's `lookup` (a stdio
        # server each worker starts, streams/testing/mcp_server.py), or with [lookup]
        # the builtin `lookup` tool; the side effects of both go to logs of the tool
        # audit (chaos.tools_audit).
        "THREADLINE_AGENT_TOOL_LOG": str(folder / "tools.log"),
        "THREADLINE_AGENT_TOOL_DELAY_S": "0.3",
        "THREADLINE_AGENT_MCP_SERVERS": json.dumps({"kb": {"command": [
            sys.executable, "-m", "streams.testing.mcp_server", "--log", str(folder / "mcp.log"),
            "--delay", "0.3"]}}),
        "THREADLINE_AGENT_MCP_TOOL": "kb__lookup",
        "THREADLINE_LOG_LEVEL": "INFO",
    })


@dataclass
class Stack:
    """The chaos run's broker (or cluster) and its processors, workers and gateways, each a process."""
    folder: Path
    brokers: int = 1  # 1: EmbeddedKafka, 3: EmbeddedCluster
    bootstrap: str | None = None  # an outside cluster: no broker of ours
    processors: list[Proc] = field(default_factory=list)
    workers: list[Proc] = field(default_factory=list)
    gateways: list[Proc] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    broker: EmbeddedKafka | None = None
    cluster: EmbeddedCluster | None = None
    env: dict[str, str] = field(default_factory=dict)
    processing_guarantee: str = "exactly_once"  # of the processors
    fault: bool = False  # arm the processors' fault point (streams.kafka.faults) with one trigger
    # The gateways as one group (THREADLINE_GATEWAY_URL: each serves its share of the
    # stream and forwards the rest) behind HAProxy, routing each request at random.
    balanced: bool = False
    by_owner: bool = False  # HAProxy runs deploy/haproxy/threadline.lua
    haproxy: HAProxy | None = None

    @property
    def fault_trigger(self) -> Path | None:
        """The file that arms the processors' fault point, if they have one."""
        return self.folder / "fault-trigger" if self.fault else None

    @property
    def owns_broker(self) -> bool:
        """Whether the broker or cluster is ours (started by this stack), so it may be restarted."""
        return self.broker is not None or self.cluster is not None

    @property
    def bases(self) -> list[str]:
        """The gateways' base URLs on 127.0.0.1."""
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    @property
    def entries(self) -> list[str]:
        """Where clients send requests: HAProxy if balanced, else the gateways."""
        return [self.haproxy.base] if self.haproxy is not None else self.bases

    @property
    def settings(self) -> Settings:
        """The run's settings, read from its environment."""
        return Settings.from_env(self.env)

    def procs(self, role: str) -> list[Proc]:
        """The processes of one role."""
        return {"processor": self.processors, "worker": self.workers,
                "gateway": self.gateways}[role]

    def all_procs(self) -> list[Proc]:
        """Every process of the run: processors, workers, then gateways."""
        return [*self.processors, *self.workers, *self.gateways]

    def start(self, gateways: int = 2) -> None:
        """Start our broker (if no outside one), the topics, two processors, two workers and the gateways."""
        bootstrap = self.bootstrap
        if bootstrap is None and self.brokers == 1:
            self.broker = EmbeddedKafka(self.folder / "broker", port=0).start()
            bootstrap = self.broker.bootstrap
        elif bootstrap is None:
            self.cluster = EmbeddedCluster(self.folder / "cluster", size=self.brokers).start()
            bootstrap = self.cluster.bootstrap
        self.env = chaos_env(bootstrap, self.folder, 3 if self.cluster is not None else 1)
        ensure_topics(self.settings)  # waits while a cluster just started elects its leaders
        logs = self.folder / "logs"
        for i in range(2):
            env = {**self.env, "THREADLINE_DATA_DIR": str(self.folder / f"processor-{i}"),
                   "THREADLINE_PROCESSING_GUARANTEE": self.processing_guarantee}
            if self.fault_trigger is not None:
                env[FAULT_ENV] = str(self.fault_trigger)
            self.processors.append(Proc("processor", env, logs / f"processor-{i}.log", name=f"processor-{i}",
                                        die_with_parent=True))
            env = {**self.env, "THREADLINE_INSTANCE_ID": f"worker-{i}"}
            self.workers.append(Proc("worker", env, logs / f"worker-{i}.log", name=f"worker-{i}",
                                     die_with_parent=True))
        for i in range(gateways):
            port = free_port()
            self.ports.append(port)
            env = {**self.env, "THREADLINE_HTTP_PORT": str(port)}
            if self.balanced:
                env["THREADLINE_GATEWAY_URL"] = f"http://127.0.0.1:{port}"
            self.gateways.append(Proc("gateway", env, logs / f"gateway-{i}.log", name=f"gateway-{i}",
                                      die_with_parent=True))
        for proc in self.all_procs():
            proc.start()
        if self.balanced:
            self.haproxy = HAProxy(free_port(), self.ports, self.folder / "haproxy",
                                   balance="random", owner_routing=self.by_owner).start()
            self.haproxy.wait_serving(
                timeout_s=180, progress=logs_of(*(g.log for g in self.gateways)))

    def restart_broker(self) -> None:
        """SIGKILL the (single) broker, then start it again on the same port and data."""
        assert self.broker is not None, "only a broker of our own is restarted"
        self.broker.kill()
        self.broker.start()

    def kill_cluster_node(self, node: int) -> None:
        """SIGKILL one node of the cluster, as a crash would."""
        assert self.cluster is not None
        self.cluster.nodes[node].kill()

    def stop(self) -> None:
        """Stop every process, then the broker or cluster of our own."""
        if self.haproxy is not None:
            self.haproxy.stop()
        for proc in self.all_procs():
            proc.stop()
        if self.broker is not None:
            self.broker.stop()
        if self.cluster is not None:
            self.cluster.stop()

    def logs(self) -> Mapping[str, Path]:
        """Each process's log file, by process name."""
        return {p.name: p.log for p in self.all_procs()}

