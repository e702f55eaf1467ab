"""`threadline <role>`: one process per role, so each can be killed alone.

    threadline broker      the embedded Kafka broker (foreground)
    threadline topics      create/verify the topics and exit
    threadline processor   the thread processor (transactional, RocksDB tables)
    threadline worker      an agent worker
    threadline gateway     the HTTP/SSE gateway
    threadline connector   the chat (Slack Events API) and webhook connector
    threadline run         broker, processor, worker and gateway, each restarted if it
                           exits, until Ctrl-C or SIGTERM; metrics on ports 9464 (processor)
                           and 9465 (worker), from THREADLINE_METRICS_PORT if set, and on the
                           gateway's GET /metrics (docs/operations.md)
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from streams.config import Settings
from streams.heap import dedicate_process
from streams.observability.settings import DEFAULT_RUN_METRICS_PORT
from streams.supervisor import ProcessChild, Supervisor

if TYPE_CHECKING:
    from streams.devtools.broker import EmbeddedKafka

__all__ = ["log_level_option", "main", "start_role"]

log = logging.getLogger("threadline")


def _embedded_broker(settings: Settings) -> EmbeddedKafka:
    """The embedded broker of `settings`: with SASL/SCRAM-SHA-512 on its listener when
    the clients are given SCRAM credentials (THREADLINE_KAFKA_SASL_USERNAME/_PASSWORD),
    that user then being created when its storage is first formatted."""
    from streams.devtools.broker import SCRAM, EmbeddedKafka

    security = settings.kafka_security
    users: dict[str, str] = {}
    if security.get("sasl.mechanism") == SCRAM and security.get("security.protocol") == "SASL_PLAINTEXT":
        users[security["sasl.username"]] = security["sasl.password"]
    elif security:
        raise SystemExit("threadline: the embedded broker offers PLAINTEXT or SASL_PLAINTEXT with "
                         f"{SCRAM} only; set KAFKA_BOOTSTRAP_SERVERS to use another cluster")
    return EmbeddedKafka(settings.data_dir / "broker", port=settings.kafka_port, scram_users=users)


def _broker(settings: Settings) -> int:
    from streams.devtools.broker import KAFKA_VERSION

    broker = _embedded_broker(settings)
    broker.start()
    print(f"threadline: Kafka {KAFKA_VERSION} (KRaft) serving on {broker.bootstrap}", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        broker.stop()
    return 0


def _topics(settings: Settings) -> int:
    from streams.kafka.topics import ensure_topics

    for spec in ensure_topics(settings):
        print(f"{spec.name}\tpartitions={spec.partitions}\t{spec.config}")
    return 0


def _processor(settings: Settings) -> int:
    from streams.observability.metrics import processor_metrics
    from streams.observability.role import observe_role
    from streams.processor import run_processor

    observe_role(settings, "processor", processor_metrics)

    return run_processor(settings)


def _worker(settings: Settings) -> int:
    from streams.observability.metrics import worker_metrics
    from streams.observability.role import observe_role
    from streams.worker import run_worker

    observe_role(settings, "worker", worker_metrics)

    return run_worker(settings)


GATEWAY_COMMAND = ["-m", "gateway"]  # the gateway role by module name: streams never imports gateway
# `python -P` as an environment variable: the current directory is not put on the module
# path of a role's interpreter, so a `gateway/` or `streams/` folder there cannot
# replace ours (tests/gateway/test_role_shadowing.py).
SAFE_PATH = {"PYTHONSAFEPATH": "1"}


def _gateway(settings: Settings) -> int:
    # exec, not a child: the role keeps this pid, so a supervisor's or a test's SIGKILL reaches it.
    os.execve(sys.executable, [sys.executable, *GATEWAY_COMMAND], {**os.environ, **SAFE_PATH})


def _connector(settings: Settings) -> int:
    from streams.connectors.role import run_connector
    from streams.observability.role import observe_role

    observe_role(settings, "connector")  # its families: streams/observability/connector.py

    return run_connector(settings)


DEV_KEYS = "dev=dev"


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and addresses in 127.0.0.0/8 or ::1: reachable from this machine only."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def dev_keys_refusal(settings: Settings) -> str | None:
    """Why `threadline run` must not fall back to the development key, or None if it may."""
    if settings.gateway.api_keys or is_loopback_host(settings.gateway.http_host):
        return None
    return (f"threadline: refusing to start: THREADLINE_HTTP_HOST={settings.gateway.http_host!r} is not a "
            "loopback address and THREADLINE_API_KEYS is unset, so anyone who can reach the gateway "
            "would get in with the well-known development key 'dev'. Set THREADLINE_API_KEYS="
            "key1=tenantA,... to keys of your own (or serve on 127.0.0.1).")


@dataclass
class _BrokerChild:
    """The embedded broker as a supervised child; started (and ready) before the supervisor."""

    broker: EmbeddedKafka
    name: str = "broker"

    def start(self) -> int:
        if self.broker.process is None or self.broker.process.poll() is not None:
            self.broker.start(wait_s=0)  # the roles wait for it themselves
        assert self.broker.process is not None
        return self.broker.process.pid

    def poll(self) -> int | None:
        process = self.broker.process
        return None if process is None else process.poll()

    def terminate(self) -> None:
        if self.broker.process is not None and self.broker.process.poll() is None:
            self.broker.process.terminate()

    def wait(self, timeout_s: float) -> None:
        self.broker.stop(timeout_s)


def _run_all(settings: Settings) -> int:
    """Start each role as a child process and keep it running (`streams.supervisor`);
    stop them all on Ctrl-C or SIGTERM."""
    from streams.kafka.topics import ensure_topics

    refusal = dev_keys_refusal(settings)
    if refusal is not None:
        print(refusal, file=sys.stderr, flush=True)
        return 2
    supervisor: Supervisor | None = None

    def _stop(*_: object) -> None:
        if supervisor is not None:
            supervisor.stop()
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    broker: EmbeddedKafka | None = None
    env = {**os.environ, **SAFE_PATH}  # the roles' interpreters: as `python -P`
    try:
        if not settings.bootstrap_servers:
            broker = _embedded_broker(settings)
            print(f"threadline: starting the embedded Kafka broker on port {broker.port} ...", flush=True)
            broker.start()
            env["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap
            settings = settings.with_(bootstrap_servers=broker.bootstrap)
        if not settings.gateway.api_keys:
            env["THREADLINE_API_KEYS"] = DEV_KEYS
            print("threadline: THREADLINE_API_KEYS is unset; accepting the development key "
                  "'dev' (Authorization: Bearer dev) for tenant 'dev' on this machine only", flush=True)
        ensure_topics(settings)
        # One metrics port each (docs/operations.md): processor, then worker; the gateway
        # serves GET /metrics on its HTTP port.
        metrics_base = settings.observability.metrics_port or DEFAULT_RUN_METRICS_PORT
        roles = [ProcessChild(role, [sys.executable, "-m", "streams.cli", role],
                              {**env, "THREADLINE_METRICS_PORT": str(metrics_base + index)})
                 for index, role in enumerate(("processor", "worker"))]
        roles.append(ProcessChild("gateway", [sys.executable, *GATEWAY_COMMAND], env))
        supervisor = Supervisor(roles, base=None if broker is None else _BrokerChild(broker))
        print(f"threadline: gateway on http://{settings.gateway.http_host}:{settings.gateway.http_port} "
              f"(Kafka {settings.bootstrap}); a role that exits is restarted; "
              "Ctrl-C stops everything", flush=True)
        supervisor.run()
    except KeyboardInterrupt:  # a signal before the supervisor was running
        pass
    finally:
        if broker is not None:
            broker.stop()
    print("threadline: stopped", flush=True)
    return 0


ROLES = {
    "broker": _broker,
    "topics": _topics,
    "processor": _processor,
    "worker": _worker,
    "gateway": _gateway,
    "connector": _connector,
    "run": _run_all,
}


def start_role(log_level: str) -> Settings:
    """Set up one role's process (its log format, the `var` folder); its settings from the environment."""
    os.environ["THREADLINE_LOG_LEVEL"] = log_level  # a role that execs another module keeps the level
    logging.basicConfig(level=log_level,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s")
    Path("var").mkdir(exist_ok=True)
    dedicate_process()  # the role freezes its start-up heap once it is up (streams/heap.py)
    settings = Settings.from_env()
    if settings.observability.log_format == "json":
        from streams.observability.logs import install_json_logs

        install_json_logs(log_level)
    return settings


def log_level_option(parser: argparse.ArgumentParser) -> None:
    """The `--log-level` option every role's command line takes."""
    parser.add_argument("--log-level", default=os.environ.get("THREADLINE_LOG_LEVEL", "INFO"))


def main(argv: Sequence[str] | None = None) -> int:
    """`threadline <role>`: run one role (or `run`: all of them, supervised) in this process."""
    parser = argparse.ArgumentParser(prog="threadline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=sorted(ROLES))
    log_level_option(parser)
    args = parser.parse_args(argv)
    return ROLES[args.role](start_role(args.log_level))


if __name__ == "__main__":
    sys.exit(main())
