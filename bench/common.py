"""Shared pieces of the benchmarks: one broker for the run, fresh topics per case,
child processes whose CPU is counted, percentiles and the figures they make."""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streams.config import Settings
from streams.kafka.topics import ensure_topics
from streams.testing.process import ChildProcess
from streams.testing.stack import broker_bootstrap, unique_prefix

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
VAR = ROOT / "var"


# The embedded broker's folder while `broker()` runs (None with an external broker):
# what the capacity benchmark reads the broker's CPU and the topics' disk from.
BROKER_FOLDER: Path | None = None


@contextmanager
def broker() -> Iterator[str]:
    """`KAFKA_BOOTSTRAP_SERVERS` if set, else an embedded broker for the whole run."""
    global BROKER_FOLDER
    folder = VAR / f"bench-broker-{uuid.uuid4().hex[:6]}"
    with broker_bootstrap(folder, remove=True) as bootstrap:
        BROKER_FOLDER = None if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") else folder
        try:
            yield bootstrap
        finally:
            BROKER_FOLDER = None


def broker_pid() -> int | None:
    """The embedded broker's JVM (its command line names its folder), or None."""
    if BROKER_FOLDER is None:
        return None
    mark = str(BROKER_FOLDER).encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if mark in f.read():
                        return int(entry)
            except OSError:
                continue
    return None


def folder_bytes(folder: Path, match: str = "", suffix: str = "") -> int:
    """Bytes of the files under `folder` (their length: Kafka's index files are sparse,
    preallocated), in subfolders whose path contains `match` and with names ending in
    `suffix`, if given."""
    total = 0
    for path in folder.rglob(f"*{suffix}"):
        if path.is_file() and match in str(path.relative_to(folder)):
            try:
                total += path.stat().st_size
            except OSError:
                continue
    return total


def bench_env(bootstrap: str, partitions: int = 12, **extra: str) -> dict[str, str]:
    """The environment of one case: its own topic prefix and data folder."""
    prefix = unique_prefix("b", 8)
    return {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "THREADLINE_TOPIC_PREFIX": prefix,
        "THREADLINE_PARTITIONS": str(partitions),
        "THREADLINE_DATA_DIR": str(VAR / f"bench-{prefix.rstrip('.')}"),
        # No deadline falls due during a run: the clock's ticks would add commands.
        "THREADLINE_HEARTBEAT_TIMEOUT_S": "3600", "THREADLINE_ATTEMPT_TIMEOUT_S": "7200",
        "THREADLINE_API_KEYS": "bench=bench", "THREADLINE_LOG_LEVEL": "WARNING",
        # One tenant stands for every client: no per-tenant limits.
        "THREADLINE_TENANT_MAX_STREAMS": "0", "THREADLINE_TENANT_MAX_REPLAYS": "0",
        "THREADLINE_TENANT_POSTS_PER_S": "0", "THREADLINE_TENANT_MAX_ACTIVE_RUNS": "0",
        "THREADLINE_REPLAY_MAX_RECORDS": "0", **extra,
    }


def fresh_settings(bootstrap: str, partitions: int = 12, **env: str) -> Settings:
    """Settings on fresh topics of the run's broker, the topics created."""
    settings = Settings.from_env(bench_env(bootstrap, partitions, **env))
    ensure_topics(settings)
    return settings


def cleanup(settings: Settings) -> None:
    """Remove a case's data folder (its topics stay until the broker goes)."""
    shutil.rmtree(settings.data_dir, ignore_errors=True)


def load_average() -> tuple[float, float, float]:
    """The machine's 1, 5 and 15 minute load averages."""
    return os.getloadavg()


def load_text() -> str:
    """The load averages as text, for the report."""
    one, five, fifteen = load_average()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


# --- measurements -------------------------------------------------------------------


@dataclass
class Figure:
    """One measured line of the report: a case, its numbers, and what it compares with."""

    bench: str  # "processor", "decision", "token", "fanout", "replay"
    case: str
    values: dict[str, float]  # metric -> value (units in the metric name)
    baseline: str | None = None  # the case this one is compared with
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU µs per event
    load: str = ""  # load average while it ran
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """The figure as a JSON object, for the saved results."""
        return {"bench": self.bench, "case": self.case, "values": self.values,
                "baseline": self.baseline, "cpu": self.cpu, "load": self.load, "note": self.note}


@dataclass
class CpuClock:
    """Wall and CPU seconds (this process, all threads, incl. librdkafka's)."""

    wall0: float = 0.0
    cpu0: float = 0.0
    wall: float = 0.0
    cpu: float = 0.0

    def __enter__(self) -> CpuClock:
        self.wall0, self.cpu0 = time.perf_counter(), own_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = own_cpu() - self.cpu0


def own_cpu() -> float:
    """CPU seconds this process has used, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_ns(pid: int) -> int:
    """Nanoseconds on a CPU of a live process, summed over its threads (the
    scheduler's own count in /proc/<pid>/task/*/schedstat: exact, where /proc/stat
    counts 10 ms ticks). Threads that already ended are not counted: read it for
    processes whose threads live as long as they do (librdkafka's, RocksDB's)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def process_rss(pid: int) -> int:
    """Resident set size in bytes."""
    with open(f"/proc/{pid}/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    """The median of the values, or NaN if there are none."""
    return statistics.median(values) if values else float("nan")


# --- child processes ------------------------------------------------------------------


class Child(ChildProcess):
    """A process of the benchmark (a Threadline role or a bench helper) whose CPU
    and memory can be read while it runs; its output goes to a log file. Started
    when made."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str], log: Path,
                 nofile: int | None = None) -> None:
        # BENCH_SRC: run the children from another checkout (before/after comparisons).
        super().__init__(name, args, env, log, cwd=os.environ.get("BENCH_SRC") or ROOT, nofile=nofile)
        self.start()
        self.cpu0 = 0.0

    @classmethod
    def role(cls, role: str, env: Mapping[str, str], folder: Path, nofile: int | None = None) \
            -> Child:
        """A child that runs one Threadline role (`threadline <role>`), logging to the folder."""
        # `streams.cli <role>`, which also starts the gateway in a BENCH_SRC checkout
        # from before `python -m gateway` existed.
        return cls(role, ["-m", "streams.cli", role], env, folder / f"{role}.log", nofile)

    def mark(self) -> None:
        """Start counting CPU from now."""
        self.cpu0 = self.cpu()

    def cpu_since_mark(self) -> float:
        """CPU seconds the child used since mark()."""
        return self.cpu() - self.cpu0

    def rss(self) -> int:
        """The child's resident memory."""
        return process_rss(self.pid)

    def tail(self, n: int = 30) -> str:
        """The last n lines of the child's log."""
        return super().tail(n)


def run_child_json(module: str, args: list[str], env: Mapping[str, str], log: Path,
                   timeout: float) -> dict[str, Any]:
    """Run `python -m module args` to the end; its last stdout line is a JSON result."""
    out = log.with_suffix(".json")
    child = Child(module, ["-m", module, *args, "--out", str(out)], env, log)
    code = child.wait(timeout)
    if code != 0 or not out.exists():
        raise RuntimeError(f"{module} {args} exited with {code}:\n{child.tail()}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result
