"""The gateway's read store at two data sizes, side by side: cold restore, warm restart,
and the gateway process's RSS once loaded.

    python -m bench.gateway_store [--threads 1000 100000] [--messages 2]

Each case writes N thread states and N x M message records straight to fresh topics
(as the processor would), starts `threadline gateway` as its own process, and reads
/healthz once it answers (the gateway serves HTTP only after its read model loaded):
the restore time and records read it reports, the time from spawn to the first
answer, and VmRSS from /proc. Then it stops the gateway, writes 100 more states and
messages, and starts it again on the same data folder and port: a warm restart.
No processor or worker runs, so /healthz is 503; its read_model figures are what
is measured. Not part of `make bench` yet: `run(bootstrap)` returns its figures
(bench "growth") for `bench/__main__.py`'s BENCHMARKS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench.common import ROOT, Figure, bench_env, broker, load_text
from gateway.kafka import partition_for
from streams.config import Settings
from streams.core.domain import RunStatus, StoredMessage, ThreadState
from streams.core.history import message_key
from streams.core.records import MessageRecord
from streams.devtools.broker import free_port
from streams.kafka.topics import ensure_topics
from streams.wire import Codec, new_meta

CODEC = Codec()  # single-object records, as the roles write them without a registry


def _write(settings: Settings, threads: int, messages: int, tag: str) -> None:
    producer = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 50,
                         "batch.size": 1 << 20, "partitioner": "murmur2_random"})
    for i in range(threads):
        thread_id = f"{tag}-{i}-{uuid.uuid4().hex[:12]}"
        state = ThreadState(thread_id, "bench", f"thread {i}", 1_000, message_count=messages,
                            run_count=(messages + 1) // 2, updated_at_ms=1_000 + i)
        producer.produce(settings.topics.threads, CODEC.encode_state(state), thread_id.encode())
        meta = new_meta(thread_id, "bench", 1_000)
        partition = partition_for(thread_id, settings.partitions)
        for seq in range(messages):
            user = seq % 2 == 0
            record = MessageRecord(seq, StoredMessage(
                f"m-{seq}", "user" if user else "assistant", "x" * 200, f"r-{i}-{seq // 2}",
                1_000 + seq), RunStatus.COMPLETED if user else None, 1 if user else 0)
            producer.produce(settings.topics.messages, CODEC.encode_message(record, meta),
                             message_key(thread_id, seq), partition=partition)
        if i % 1_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _start(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], float, Any]:
    started = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streams.cli", "gateway"],
                                env={**os.environ, **env}, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{env['THREADLINE_HTTP_PORT']}/healthz"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # 503: no processor, as intended
            body = json.load(exc)
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.05)
            continue
        return proc, time.monotonic() - started, body


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def case(bootstrap: str, threads: int, messages: int) -> dict[str, Any]:
    """Write this many threads, then time the gateway's cold restore and warm restart and read its RSS."""
    env = bench_env(bootstrap, 12, THREADLINE_HTTP_PORT=str(free_port()),
                    THREADLINE_LOG_LEVEL="INFO")
    settings = Settings.from_env(env)
    ensure_topics(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    log = settings.data_dir / "gateway.log"
    try:
        t0 = time.monotonic()
        _write(settings, threads, messages, "a")
        written_s = time.monotonic() - t0
        proc, cold_s, cold = _start(env, log)
        cold_rss = _rss_kb(proc.pid)
        _stop(proc)
        _write(settings, 100, messages, "b")
        proc, warm_s, warm = _start(env, log)
        warm_rss = _rss_kb(proc.pid)
        _stop(proc)
        return {"threads": threads, "messages": threads * messages, "write_s": written_s,
                "cold_to_http_s": cold_s, "cold_restore_s": cold["read_model"]["restore_s"],
                "cold_read": cold["read_model"]["read_until_loaded"],
                "cold_rss_mb": cold_rss / 1024, "cold_rocksdb": cold["read_model"]["rocksdb"],
                "warm_to_http_s": warm_s, "warm_restore_s": warm["read_model"]["restore_s"],
                "warm_read": warm["read_model"]["read_until_loaded"],
                "warm_rss_mb": warm_rss / 1024, "warm_rocksdb": warm["read_model"]["rocksdb"]}
    finally:
        shutil.rmtree(settings.data_dir, ignore_errors=True)


def run(bootstrap: str, sizes: tuple[int, ...] = (1_000, 100_000),
        messages: int = 2) -> list[Figure]:
    """The cases as report figures: each size against the smallest."""
    figures = []
    for n in sizes:
        r = case(bootstrap, n, messages)
        figures.append(Figure(
            "growth", f"gateway store, {n:,} threads", {
                "cold restore s": r["cold_restore_s"], "cold RSS MB": r["cold_rss_mb"],
                "warm restart to HTTP s": r["warm_to_http_s"],
                "warm restore s": r["warm_restore_s"], "warm RSS MB": r["warm_rss_mb"]},
            baseline=None if n == sizes[0] else f"gateway store, {sizes[0]:,} threads",
            load=load_text(), note=f"{n * messages:,} message records"))
    return figures


def main() -> None:
    """Measure the read store at each thread count and print the results and their ratios."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_store", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1_000, 100_000])
    parser.add_argument("--messages", type=int, default=2, help="messages per thread")
    args = parser.parse_args()
    with broker() as bootstrap:
        results = [case(bootstrap, n, args.messages) for n in args.threads]
    for r in results:
        print(json.dumps(r))
    if len(results) > 1:
        small, large = results[0], results[-1]
        print(f"ratio {large['threads']}/{small['threads']} threads: cold restore "
              f"{large['cold_restore_s'] / small['cold_restore_s']:.1f}x, warm restart to "
              f"HTTP {large['warm_to_http_s'] / small['warm_to_http_s']:.2f}x, RSS warm "
              f"{large['warm_rss_mb'] / small['warm_rss_mb']:.2f}x, cold "
              f"{large['cold_rss_mb'] / small['cold_rss_mb']:.2f}x")


if __name__ == "__main__":
    main()
