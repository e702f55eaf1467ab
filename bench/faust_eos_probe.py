"""Probe: does faust-streaming's `exactly_once` mode keep a table and its output
consistent across `kill -9`? (Evidence for docs/exactly-once.md.)

A Faust app counts records per key in a rocksdict-backed table and emits
`key:count` for each input record. With exactly-once processing the output, read
`read_committed`, must hold every count 1..N of every key exactly once. The
driver pre-loads the input, runs the app as a subprocess, kills it with SIGKILL
at random moments, restarts it, and audits the output.

    python -m bench.faust_eos_probe            # driver: prints the audit
    python -m bench.faust_eos_probe worker     # the Faust app (started by the driver)
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KEYS = int(os.environ.get("PROBE_KEYS", "40"))
PER_KEY = int(os.environ.get("PROBE_PER_KEY", "150"))
PARTITIONS = 4


def _app() -> Any:
    import faust

    prefix = os.environ["PROBE_PREFIX"]
    app = faust.App(
        f"{prefix}app", broker=f"kafka://{os.environ['PROBE_BOOTSTRAP']}",
        processing_guarantee="exactly_once", store="rocksdb://",
        datadir=os.environ["PROBE_DATADIR"], topic_partitions=PARTITIONS,
        broker_commit_every=50, broker_commit_interval=0.1, web_enabled=False,
    )
    source = app.topic(f"{prefix}in", partitions=PARTITIONS, key_serializer="raw",
                       value_serializer="raw")
    sink = app.topic(f"{prefix}out", partitions=PARTITIONS, key_serializer="raw",
                     value_serializer="raw")
    counts = app.Table("counts", default=int, partitions=PARTITIONS, key_type=str, value_type=int)

    @app.agent(source)
    async def count(stream: Any) -> None:
        async for key, _value in stream.items():
            name = key.decode()
            counts[name] += 1
            await sink.send(key=key, value=f"{name}:{counts[name]}".encode())

    return app


def worker() -> None:
    """Run the probe's Faust app as a worker (the child process)."""
    app = _app()
    sys.argv = [sys.argv[0], "worker", "-l", "warn", "--without-web"]
    app.main()


def _read_output(bootstrap: str, topic: str, expect: int, timeout: float) -> list[str]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-{time.time()}",
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "log_level": 0})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values: list[str] = []
    deadline = time.monotonic() + timeout
    idle = 0.0
    while time.monotonic() < deadline and (len(values) < expect or idle < 3):
        batch = consumer.consume(500, 0.2)
        idle = idle + 0.2 if not batch else 0.0
        values += [(m.value() or b"").decode() for m in batch if m.error() is None]
    consumer.close()
    return values


def drive(seed: int = 1, kills: int = 4) -> dict[str, int]:
    """Feed the Faust app, kill it with SIGKILL at random moments, and count table and output mismatches."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    from bench.common import broker

    rng = random.Random(seed)
    with broker() as bootstrap:
        prefix = f"probe{seed}-"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for fut in admin.create_topics([NewTopic(f"{prefix}{n}", PARTITIONS, 1)
                                        for n in ("in", "out")]).values():
            fut.result()
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for _ in range(PER_KEY):
            for k in range(KEYS):
                producer.produce(f"{prefix}in", b"x", f"k{k}".encode())
            producer.poll(0)
        producer.flush(60)
        data = Path("var") / f"probe-{seed}-{int(time.time())}"
        env = {**os.environ, "PROBE_PREFIX": prefix, "PROBE_BOOTSTRAP": bootstrap,
               "PROBE_DATADIR": str(data), "PYTHONUNBUFFERED": "1"}
        log = open(data.with_suffix(".log"), "ab")  # noqa: SIM115
        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen([sys.executable, "-m", "bench.faust_eos_probe", "worker"],
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
        proc = start()
        for _ in range(kills):
            time.sleep(rng.uniform(8, 14))  # Faust needs a few seconds to join and recover
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            proc = start()
        values = _read_output(bootstrap, f"{prefix}out", KEYS * PER_KEY, timeout=240)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    seen = collections.Counter(values)
    per_key: dict[str, set[int]] = collections.defaultdict(set)
    for v in seen:
        key, count = v.rsplit(":", 1)
        per_key[key].add(int(count))
    expected = set(range(1, PER_KEY + 1))
    return {
        "input records": KEYS * PER_KEY,
        "output records": len(values),
        "duplicated outputs": sum(n - 1 for n in seen.values() if n > 1),
        "missing counts": sum(len(expected - per_key.get(f"k{k}", set())) for k in range(KEYS)),
        "counts beyond N (state ran ahead)": sum(len(s - expected) for s in per_key.values()),
        "kills": kills,
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker()
    else:
        for name, value in drive(int(os.environ.get("PROBE_SEED", "1"))).items():
            print(f"{name:40s} {value}")
