"""Decision latency: `POST /v1/threads/{id}/user_message` -> `202`, at a fixed rate.

Real processes: processor, worker and gateway (`threadline <role>`). Every post goes
to a fresh thread (created beforehand through the gateway), so none is a 409. The
schedule is open-loop: request i is due at t0 + i/rate and its latency counts from
that moment, so a slow answer delays no later request and hides no queueing.

Baseline, in the same run and at the same rate on the same processor: a direct
Kafka round trip, the command produced with confluent-kafka and its decision read
back from the events topic (read_committed) by a confluent-kafka consumer; the gap
is what the gateway (HTTP, aiokafka, the read model) adds to the processor's
transaction.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import aiohttp
from confluent_kafka import Consumer, Producer, TopicPartition

from bench.common import Figure, load_text, percentile
from bench.stack import AUTH, Stack, new_stack
from streams.core.domain import CreateThread, PostUserMessage
from streams.wire import Codec, new_meta

CODEC = Codec()  # single-object records, as the roles write them without a registry

BENCH = "decision"
RATE = 20  # requests per second
SECONDS = 20
WARMUP = 25


async def _posts(stack: Stack, session: aiohttp.ClientSession, threads: list[str],
                 rate: float) -> tuple[list[float], dict[int, int]]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def one(thread_id: str, due: float) -> None:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        async with session.post(f"{stack.base}/v1/threads/{thread_id}/user_message",
                                json={"input_text": "what is the offset of this answer?"},
                                headers=AUTH) as response:
            await response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
            if response.status == 202:
                latencies.append((time.perf_counter() - due) * 1000)

    t0 = time.perf_counter() + 0.2
    await asyncio.gather(*(one(t, t0 + i / rate) for i, t in enumerate(threads)))
    return latencies, statuses


def _direct(stack: Stack, count: int, rate: float) -> tuple[list[float], list[float], list[float]]:
    """Produce PostUserMessage commands at `rate` to fresh threads; time each decision.

    Returns the latencies and their two parts: until the processor produced the
    decision (its CreateTime, set by librdkafka at `produce`), and from then until a
    read_committed consumer got it (the rest of the batch, the transaction's commit,
    its markers, the fetch)."""
    settings = stack.settings
    topics = settings.topics
    producer = Producer({"bootstrap.servers": settings.bootstrap, "partitioner": "murmur2_random",
                         "linger.ms": 2, "enable.idempotence": True, "log_level": 0})
    threads = [f"direct-{uuid.uuid4().hex[:12]}" for _ in range(count)]
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"d{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 100, "log_level": 0})
    parts = [TopicPartition(topics.events, p) for p in range(settings.partitions)]
    ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
    consumer.assign([TopicPartition(topics.events, p, o) for p, o in enumerate(ends)])
    now = int(time.time() * 1000)
    for thread in threads:  # created first, decided before the timed posts
        meta = new_meta(thread, "bench", now)
        producer.produce(topics.commands, CODEC.encode_command(CreateThread(thread, "bench", "d", now),
                                                         meta), thread.encode())
    producer.flush(30)
    sent: dict[str, float] = {}
    latencies: list[float] = []
    produced: list[float] = []  # due -> the decision's CreateTime
    visible: list[float] = []  # CreateTime -> received
    wall_offset = time.time() - time.perf_counter()
    done = threading.Event()

    def read() -> None:
        deadline = time.monotonic() + count / rate + 60
        while len(latencies) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is None or msg.error() is not None:
                continue
            meta, _event = CODEC.decode_event(msg.value() or b"")
            due = sent.pop(meta.traceparent or "", None)
            if due is not None:
                now = time.perf_counter()
                latencies.append((now - due) * 1000)
                created = msg.timestamp()[1] / 1000 - wall_offset  # on the perf_counter scale
                produced.append((created - due) * 1000)
                visible.append((now - created) * 1000)
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(2.0)  # the CreateThread decisions go by first
    t0 = time.perf_counter()
    for i, thread in enumerate(threads):
        due = t0 + i / rate
        time.sleep(max(0.0, due - time.perf_counter()))
        trace = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
        sent[trace] = due
        meta = new_meta(thread, "bench", int(time.time() * 1000), trace)
        command = PostUserMessage(thread, "bench", str(uuid.uuid4()), "what is the offset?",
                                  None, int(time.time() * 1000))
        producer.produce(topics.commands, CODEC.encode_command(command, meta), thread.encode())
        producer.poll(0)
    producer.flush(30)
    done.wait(count / rate + 70)
    consumer.close()
    return latencies, produced, visible


def _parts(produced: list[float], visible: list[float]) -> str:
    return (f"until the processor produced the decision p50 {percentile(produced, 50):.1f} / "
            f"p99 {percentile(produced, 99):.1f} ms; then until a read_committed consumer had "
            f"it p50 {percentile(visible, 50):.1f} / p99 {percentile(visible, 99):.1f} ms "
            "(CreateTime has millisecond resolution)")


def _figure(case: str, latencies: list[float], rate: float, cpu: dict[str, float], load: str,
            baseline: str | None = None, note: str = "") -> Figure:
    values = {"rate/s": rate, "requests": len(latencies),
              "p50 ms": percentile(latencies, 50), "p95 ms": percentile(latencies, 95),
              "p99 ms": percentile(latencies, 99), "max ms": max(latencies, default=float("nan"))}
    return Figure(BENCH, case, values, baseline, cpu, load, note)


async def _run(bootstrap: str, rate: float, seconds: float) -> list[Figure]:
    count = int(rate * seconds)
    stack = new_stack(bootstrap).start(["processor", "worker", "gateway"])
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=30)) as session:
            await stack.healthy(session)
            threads = await stack.create_threads(session, count + WARMUP)
            await _posts(stack, session, threads[:WARMUP], rate)
            await asyncio.sleep(1.0)
            load = load_text()
            stack.mark()
            latencies, statuses = await _posts(stack, session, threads[WARMUP:], rate)
            cpu = stack.cpu_us_per(count)
            bad = {s: n for s, n in statuses.items() if s != 202}
            gateway = _figure("gateway", latencies, rate, cpu, load, "direct Kafka",
                              f"statuses other than 202: {bad}" if bad else "")
            print(f"  gateway   p50 {gateway.values['p50 ms']:.1f}  p99 "
                  f"{gateway.values['p99 ms']:.1f} ms  (load {load})", flush=True)
            await asyncio.sleep(2.0)  # the runs just started finish
            load = load_text()
            stack.children["processor"].mark()
            direct, produced, visible = await asyncio.to_thread(_direct, stack, count, rate)
            cpu = {"processor": stack.children["processor"].cpu_since_mark() / count * 1e6}
            baseline = _figure("direct Kafka", direct, rate, cpu, load, note=_parts(produced, visible))
            print(f"  direct    p50 {baseline.values['p50 ms']:.1f}  p99 "
                  f"{baseline.values['p99 ms']:.1f} ms  (load {load})", flush=True)
            for metric in ("p50 ms", "p99 ms"):
                gateway.values[f"adds {metric}"] = gateway.values[metric] - baseline.values[metric]
            # Without the answers: the worker stopped, so no run streams (the posts are
            # decided and stay queued). What the gateway's path costs on a free CPU.
            more = await stack.create_threads(session, count)
            stack.children.pop("worker").stop()
            await asyncio.sleep(2.0)
            load = load_text()
            stack.mark()
            latencies, statuses = await _posts(stack, session, more, rate)
            cpu = stack.cpu_us_per(count)
            idle = _figure("gateway, no answers streaming", latencies, rate, cpu, load,
                           "direct Kafka, processor alone")
            print(f"  no worker p50 {idle.values['p50 ms']:.1f}  p99 "
                  f"{idle.values['p99 ms']:.1f} ms  (load {load})", flush=True)
            # The same round trip with the processor alone: what the stack's own load
            # (answers streamed by the worker, ingested by the gateway) costs it.
            stack.children.pop("gateway").stop()
            await asyncio.sleep(2.0)
            load = load_text()
            stack.children["processor"].mark()
            alone, produced, visible = await asyncio.to_thread(_direct, stack, count, rate)
            cpu = {"processor": stack.children["processor"].cpu_since_mark() / count * 1e6}
            quiet = _figure("direct Kafka, processor alone", alone, rate, cpu, load,
                            note=_parts(produced, visible))
            print(f"  alone     p50 {quiet.values['p50 ms']:.1f}  p99 "
                  f"{quiet.values['p99 ms']:.1f} ms  (load {load})", flush=True)
            for metric in ("p50 ms", "p99 ms"):
                idle.values[f"adds {metric}"] = idle.values[metric] - quiet.values[metric]
            return [gateway, baseline, idle, quiet]
    finally:
        stack.stop()


def run(bootstrap: str, rate: float = RATE, seconds: float = SECONDS) -> list[Figure]:
    """Measure POST -> 202 latency at a fixed rate against a real stack."""
    return asyncio.run(_run(bootstrap, rate, seconds))


if __name__ == "__main__":
    from bench.common import broker

    with broker() as bootstrap:
        for figure in run(bootstrap):
            print(figure.case, figure.values, figure.cpu)
