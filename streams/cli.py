"""`threadline <role>`: one process per role, so each can be killed alone.

    threadline broker      the embedded Kafka broker (foreground)
    threadline topics      create/verify the topics and exit
    threadline processor   the thread processor (transactional, RocksDB tables)
    threadline worker      an agent worker
    threadline gateway     the HTTP/SSE gateway
    threadline connector   the chat (Slack Events API) and webhook connector
    threadline run         broker, processor, worker and gateway, until Ctrl-C or SIGTERM
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from streams.config import Settings

__all__ = ["main"]

log = logging.getLogger("threadline")


def _broker(settings: Settings) -> int:
    from streams.broker import KAFKA_VERSION, EmbeddedKafka

    broker = EmbeddedKafka(settings.data_dir / "broker", port=settings.kafka_port)
    broker.start()
    print(f"threadline: Kafka {KAFKA_VERSION} (KRaft) serving on {broker.bootstrap}", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        broker.stop()
    return 0


def _topics(settings: Settings) -> int:
    from streams.topics import ensure_topics

    for spec in ensure_topics(settings):
        print(f"{spec.name}\tpartitions={spec.partitions}\t{spec.config}")
    return 0


def _processor(settings: Settings) -> int:
    from streams.processor import run_processor

    return run_processor(settings)


def _worker(settings: Settings) -> int:
    from streams.worker import run_worker

    return run_worker(settings)


def _gateway(settings: Settings) -> int:
    from gateway.app import run_gateway

    code: int = run_gateway(settings)
    return code


def _connector(settings: Settings) -> int:
    from streams.connectors.role import run_connector

    return run_connector(settings)


def _run_all(settings: Settings) -> int:
    """Start each role as a child process; stop them all on Ctrl-C or SIGTERM."""
    from streams.broker import EmbeddedKafka
    from streams.topics import ensure_topics

    broker: EmbeddedKafka | None = None
    env = dict(os.environ)
    if not settings.bootstrap_servers:
        broker = EmbeddedKafka(settings.data_dir / "broker", port=settings.kafka_port)
        print(f"threadline: starting the embedded Kafka broker on port {broker.port} ...", flush=True)
        broker.start()
        env["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap
        settings = settings.with_(bootstrap_servers=broker.bootstrap)
    if not settings.api_keys:
        env["THREADLINE_API_KEYS"] = "dev=dev"
        print("threadline: THREADLINE_API_KEYS is unset; accepting the development key "
              "'dev' (Authorization: Bearer dev) for tenant 'dev'", flush=True)
    ensure_topics(settings)
    children: list[subprocess.Popen[bytes]] = []
    try:
        for role in ("processor", "worker", "gateway"):
            children.append(subprocess.Popen([sys.executable, "-m", "streams.cli", role], env=env))
        print(f"threadline: gateway on http://{settings.http_host}:{settings.http_port} "
              f"(Kafka {settings.bootstrap}); Ctrl-C stops everything", flush=True)
        stop = {"now": False}

        def _stop(*_: object) -> None:
            stop["now"] = True

        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
        while not stop["now"]:
            for child in children:
                if child.poll() is not None:
                    print(f"threadline: {child.args!r} exited with {child.returncode}", flush=True)
                    stop["now"] = True
            time.sleep(0.2)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                child.kill()
        if broker is not None:
            broker.stop()
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="threadline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--log-level", default=os.environ.get("THREADLINE_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s")
    Path("var").mkdir(exist_ok=True)
    return ROLES[args.role](Settings.from_env())


if __name__ == "__main__":
    sys.exit(main())
