"""Where a run's latency goes, hop by hop (issue #22): Threadline as `bench.peers`
runs it (shipped defaults but the peers' raised limits; the builtin agent's tool
mode, 4 instant tools), runs posted one at a time after a warm-up; then every
record of the commands, events, dispatch and stream topics is read back, and for
each kind of record (a command, an event, a stream part by type, a step by number)
the median of its CreateTime minus the post's, over the runs. A record's time is
when its producer made it, so a hop shows what the previous one's transaction (its
commit, then a read_committed fetch) and the next role's work cost.

    python -m bench.run_hops [--runs 40] [--warm-broker 3000]

`--warm-broker N`: first, N transactions of one record each on a scratch topic, so
the broker's JVM has compiled its transaction path, as a broker that has run a while
has (a fresh one commits in about 9 ms here, a warm one in about 5).

Prints; writes nothing. Millisecond timestamps: read the medians, not one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import aiohttp
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.peers.threadline import Threadline
from streams.wire import Codec

WARMUP = 10


def read_topic(bootstrap: str, topic: str) -> list[Message]:
    """Every committed record of `topic`, from the start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "run-hops",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "log_level": 3})
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    records: list[Message] = []
    idle = 0
    while idle < 2:
        batch = consumer.consume(1000, 1.0)
        idle = 0 if batch else idle + 1
        records += [m for m in batch if m.error() is None]
    consumer.close()
    return records


def hops(bootstrap: str, prefix: str, codec: Codec) -> dict[str, list[tuple[int, str]]]:
    """Each thread's records as (CreateTime, what it is)."""
    seen: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for m in read_topic(bootstrap, prefix + "commands"):
        meta, command = codec.decode_command(m.value() or b"")
        entry = getattr(command, "entry", None)
        label = type(command).__name__ + (f" #{entry.step}" if entry is not None else "")
        seen[meta.thread_id].append((m.timestamp()[1], f"command {label}"))
    for m in read_topic(bootstrap, prefix + "events"):
        meta, event = codec.decode_event(m.value() or b"")
        entry = getattr(event, "entry", None)
        label = type(event).__name__ + (f" #{entry.step}" if entry is not None else "")
        seen[meta.thread_id].append((m.timestamp()[1], f"event {label}"))
    for m in read_topic(bootstrap, prefix + "dispatch"):
        meta, _ = codec.decode_dispatch(m.value() or b"")
        seen[meta.thread_id].append((m.timestamp()[1], "dispatch"))
    for m in read_topic(bootstrap, prefix + "stream"):
        meta, output = codec.decode_stream(m.value() or b"")
        lifecycle = getattr(output.payload, "event", None)
        label = type(output.payload).__name__ + (f" {lifecycle}" if lifecycle else "")
        seen[meta.thread_id].append((m.timestamp()[1], f"stream {label}"))
    return seen


def warm_broker(bootstrap: str, topic: str, transactions: int) -> float:
    """`transactions` transactions of one record each on `topic` (made here); ms each,
    on average."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 3, "linger.ms": 0,
                         "transactional.id": f"warm-{uuid.uuid4().hex[:8]}",
                         "retry.backoff.ms": 2, "retry.backoff.max.ms": 50})
    producer.init_transactions(30)
    started = time.perf_counter()
    for _ in range(transactions):
        producer.begin_transaction()
        producer.produce(topic, b"warm", key=b"warm")
        producer.commit_transaction(30)
    return (time.perf_counter() - started) * 1e3 / max(transactions, 1)


async def measure(runs: int, warm: int) -> None:
    """Post `runs` runs one at a time after a warm-up; print each kind of record's
    median time after its run's post."""
    system = Threadline(Path(tempfile.mkdtemp(prefix="run-hops-")))
    codec = Codec()  # single-object records, as the roles write them without a registry
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await system.start(session)
        try:
            if warm:
                took = await asyncio.to_thread(
                    warm_broker, system.broker.bootstrap,
                    system.env["THREADLINE_TOPIC_PREFIX"] + "warm", warm)
                print(f"broker warmed: {warm} transactions, {took:.2f} ms each")
            slots = await system.prepare(session, WARMUP + runs)
            answered: dict[str, float] = {}
            for i, slot in enumerate(slots):
                end = await system.run(session, slot, f"h{i}", 0.0, time.monotonic() + 60, {})
                if i >= WARMUP and end is not None:
                    answered[slot] = time.time() * 1000
            seen = await asyncio.to_thread(hops, system.broker.bootstrap,
                                           system.env["THREADLINE_TOPIC_PREFIX"], codec)
        finally:
            await system.stop()
    after: dict[str, list[float]] = defaultdict(list)
    for slot, done in answered.items():
        records = sorted(seen[slot])
        post = next(t for t, what in records if what == "command PostUserMessage")
        first: dict[str, int] = {}
        for t, what in records:
            first.setdefault(what, t)
        for what, t in first.items():
            after[what].append(t - post)
        after["the client has the run's end (SSE)"].append(done - post)
    print(f"{len(answered)} runs one at a time; ms after the post, median:")
    for what in sorted(after, key=lambda w: statistics.median(after[w])):
        if statistics.median(after[what]) >= 0:
            print(f"  {statistics.median(after[what]):7.1f}  {what}")


def main() -> None:
    """Parse the arguments and measure."""
    parser = argparse.ArgumentParser(prog="python -m bench.run_hops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--warm-broker", type=int, default=0, metavar="N",
                        help="N one-record transactions on the broker first")
    args = parser.parse_args()
    asyncio.run(measure(args.runs, args.warm_broker))


if __name__ == "__main__":
    main()
