"""Replay: 10,000 events of one thread replayed from an early Last-Event-ID, against a
bare seek-and-consume of the same range, in the same run.

One gateway process; one thread whose run has 10,000 SSE events in the stream
topic (`run_accepted`, `message_start`, `text_start`, then deltas), written before
the gateway starts, so the feed's window does not hold them and the gateway reads
them from Kafka (`gateway.live.replay`), then continues from its window. The client
resumes after `message_start` and stops at the last event. Baselines: a
confluent-kafka consumer that seeks to the same offset and reads the same records
(raw, and decoding each). Each is repeated and the medians reported.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from confluent_kafka import Consumer, Producer, TopicPartition

from bench.common import Figure, load_text, median
from bench.stack import AUTH, Stack, new_stack
from bench.streamgen import TENANT, complete_frames, seed_threads
from gateway.kafka import partition_for
from gateway.live.tokens import ResumeTokens
from streams.core.ids import answer_message_id_for
from streams.core.records import MessageStart, RunLifecycle, StreamOutput, TextDelta, TextStart
from streams.wire import Codec, new_meta

CODEC = Codec()  # single-object records, as the roles write them without a registry

BENCH = "replay"
EVENTS = 10_000
REPEATS = 5


def _write_run(stack: Stack, thread: str, events: int) -> tuple[int, int, str]:
    """The run's records; (partition, offset of run_accepted, run id)."""
    settings = stack.settings
    producer = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 5,
                         "enable.idempotence": True, "log_level": 0})
    partition = partition_for(thread, settings.partitions)
    run = "run-replay"
    message = answer_message_id_for(run)
    offsets: list[int] = []

    def delivered(err: object, msg: object) -> None:
        offsets.append(msg.offset())  # type: ignore[attr-defined]

    def send(output: StreamOutput) -> None:
        meta = new_meta(thread, TENANT, int(time.time() * 1000))
        producer.produce(settings.topics.stream, CODEC.encode_stream(output, meta), thread.encode(),
                         partition=partition, on_delivery=delivered)
        producer.poll(0)

    send(StreamOutput(run, 0, message, "lifecycle", 0, RunLifecycle("run_accepted", "m", "")))
    producer.flush(30)
    send(StreamOutput(run, 1, message, "x:message", 0, MessageStart("assistant")))
    send(StreamOutput(run, 1, message, "x:text:0", 1, TextStart()))
    for seq in range(2, events - 1):
        send(StreamOutput(run, 1, message, "x:text:0", seq, TextDelta(f" token{seq}")))
    producer.flush(60)
    return partition, min(offsets), run


async def _gateway_replay(stack: Stack, thread: str, after: str, expected: int) -> float:
    """Seconds from the request to the last expected event."""
    url = f"{stack.base}/v1/threads/{thread}/stream"
    headers = {**AUTH, "Last-Event-ID": after}
    got, rest = 0, b""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        t0 = time.perf_counter()
        async with session.get(url, headers=headers) as response:
            assert response.status == 200, await response.text()
            while got < expected:
                chunk = await response.content.readany()
                if not chunk:
                    raise RuntimeError(f"stream ended after {got} of {expected} events")
                whole, rest = complete_frames(rest + chunk)
                got += whole.count(b"\nevent: ")
        return time.perf_counter() - t0


def _bare(stack: Stack, partition: int, start: int, last: int, decode: bool) -> float:
    settings = stack.settings
    t0 = time.perf_counter()
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "bench-replay",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "log_level": 0})
    consumer.assign([TopicPartition(settings.topics.stream, partition, start)])
    done = False
    while not done:
        # A short timeout: consume(n, timeout) returns early only once it has n records,
        # so the range's last, short batch would otherwise wait out the timeout.
        for msg in consumer.consume(2000, 0.005):
            if msg.error() is not None:
                continue
            if decode:
                CODEC.decode_stream(msg.value() or b"")
            if (msg.offset() or 0) >= last:
                done = True
                break
    elapsed = time.perf_counter() - t0
    consumer.close()
    return elapsed


async def _run(bootstrap: str, events: int, repeats: int) -> list[Figure]:
    stack = new_stack(bootstrap)
    thread = seed_threads(stack.settings, 1)[0]
    partition, start, run_id = _write_run(stack, thread, events)
    last = start + events - 1
    stack.start(["gateway"])
    try:
        async with aiohttp.ClientSession() as session:
            await stack.healthy(session)
        # Resume after message_start (offset start+1): every later event is replayed.
        after = ResumeTokens.from_settings(stack.settings).sign(thread, partition, start + 1, 0,
                                                               start, run_id)
        expected = events - 2
        load = load_text()
        gateway_cpu = stack.children["gateway"]
        times: dict[str, list[float]] = {"gateway replay": [], "bare consume": [],
                                         "bare consume + decode": []}
        cpu: list[float] = []
        for _ in range(repeats):
            gateway_cpu.mark()
            times["gateway replay"].append(await _gateway_replay(stack, thread, after, expected))
            cpu.append(gateway_cpu.cpu_since_mark())
            times["bare consume"].append(_bare(stack, partition, start + 2, last, False))
            times["bare consume + decode"].append(_bare(stack, partition, start + 2, last, True))
    finally:
        stack.stop()
    figures = []
    bare = median(times["bare consume"])
    for case, values in times.items():
        seconds = median(values)
        figure = Figure(BENCH, case, {"events": expected, "seconds": seconds,
                                      "events/s": expected / seconds, "x bare": seconds / bare},
                        None if case == "bare consume" else "bare consume", {}, load)
        figures.append(figure)
    figures[0].cpu = {"gateway": median(cpu) / expected * 1e6}
    print("  " + "  ".join(f"{f.case} {f.values['seconds'] * 1000:.0f} ms" for f in figures)
          + f"  (load {load})", flush=True)
    return figures


def run(bootstrap: str, events: int = EVENTS, repeats: int = REPEATS) -> list[Figure]:
    """Time replays of one long run against a bare seek-and-consume of the same range."""
    return asyncio.run(_run(bootstrap, events, repeats))


if __name__ == "__main__":
    from bench.common import broker

    with broker() as bootstrap:
        for figure in run(bootstrap):
            print(figure.case, figure.values, figure.cpu)
