"""Shared pieces of the benchmarks: one broker for the run, fresh topics per case."""

from __future__ import annotations

import os
import resource
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from streams.config import Settings
from streams.topics import ensure_topics

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@contextmanager
def broker() -> Iterator[str]:
    """`KAFKA_BOOTSTRAP_SERVERS` if set, else an embedded broker for the whole run."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        return
    from streams.broker import EmbeddedKafka

    data = ROOT / "var" / f"bench-broker-{uuid.uuid4().hex[:6]}"
    kafka = EmbeddedKafka(data, port=0)
    kafka.start()
    try:
        yield kafka.bootstrap
    finally:
        kafka.stop()
        import shutil

        shutil.rmtree(data, ignore_errors=True)


def fresh_settings(bootstrap: str, partitions: int = 12, **env: str) -> Settings:
    prefix = f"b{uuid.uuid4().hex[:8]}."
    settings = Settings.from_env({
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "THREADLINE_TOPIC_PREFIX": prefix,
        "THREADLINE_PARTITIONS": str(partitions),
        "THREADLINE_DATA_DIR": str(ROOT / "var" / f"bench-{prefix.rstrip('.')}"), **env,
    })
    ensure_topics(settings)
    return settings


@dataclass
class CpuClock:
    """Wall and CPU seconds (this process, all threads, incl. librdkafka's)."""

    wall0: float = 0.0
    cpu0: float = 0.0

    def __enter__(self) -> CpuClock:
        self.wall0, self.cpu0 = time.perf_counter(), _cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = _cpu() - self.cpu0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
