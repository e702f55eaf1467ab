"""What a worker writes, at a chosen rate, with the produce time in each delta; and the
readers that time it: SSE clients through the gateway and a direct Kafka consumer.

The generator produces exactly the stream records a worker and the processor
would for one run per thread (`run_accepted`, `MessageStart`, `TextStart`, then
`TextDelta`s), with the worker's producer settings (aiokafka, acks=all,
idempotent), and puts `time.time_ns()` taken just before `send` in the delta
text. Threads are made known to the gateway by writing their state to the
`threads` changelog, as the processor would, so no processor is needed.

Helper processes (`python -m bench.streamgen sse|direct ...`) write their samples
(latencies in ms, events counted) as JSON and stop by themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer

from streams.config import Settings
from streams.core.domain import ThreadState
from streams.core.ids import answer_message_id_for
from streams.core.records import MessageStart, RunLifecycle, StreamOutput, TextDelta, TextStart
from streams.wire import Codec, new_meta, stream_headers

CODEC = Codec()  # single-object records, as the roles write them without a registry

TENANT = "bench"
DELTA_HEADERS = stream_headers(TextDelta(""))  # what the worker puts on a delta
_DELTA_TS = re.compile(rb'"delta":"ts(\d+)"')


def seed_threads(settings: Settings, count: int) -> list[str]:
    """`count` threads in the threads changelog (the gateway's read model)."""
    threads = [f"fan-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    producer = Producer({"bootstrap.servers": settings.bootstrap, "partitioner": "murmur2_random",
                         "linger.ms": 5, "log_level": 0})
    now = int(time.time() * 1000)
    for thread in threads:
        state = ThreadState(thread_id=thread, tenant=TENANT, title="bench", created_at_ms=now)
        producer.produce(settings.topics.threads, CODEC.encode_state(state), thread.encode())
    producer.flush(30)
    return threads


class Generator:
    """One run per thread, then deltas round-robin over the threads at a fixed rate."""

    def __init__(self, settings: Settings, threads: list[str]) -> None:
        self.settings, self.threads = settings, threads
        self.runs = {t: str(uuid.uuid4()) for t in threads}
        self.execution = uuid.uuid4().hex[:8]
        self.seq = dict.fromkeys(threads, 0)
        self.sent = 0
        self._producer: AIOKafkaProducer | None = None

    async def __aenter__(self) -> Generator:
        self._producer = AIOKafkaProducer(bootstrap_servers=self.settings.bootstrap,
                                          acks="all", enable_idempotence=True)
        await self._producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._producer is not None:
            await self._producer.stop()

    async def _send(self, thread: str, output: StreamOutput) -> None:
        assert self._producer is not None
        meta = new_meta(thread, TENANT, int(time.time() * 1000))
        # With the headers a worker and the processor write: a reader skips a record
        # of a thread nobody watches by them, undecoded.
        await self._producer.send(self.settings.topics.stream, CODEC.encode_stream(output, meta),
                                  key=thread.encode(), headers=stream_headers(output.payload))

    def _output(self, thread: str, part: str, payload: Any, attempt: int = 1) -> StreamOutput:
        run = self.runs[thread]
        seq = self.seq[thread]
        self.seq[thread] = seq + 1
        return StreamOutput(run, attempt, answer_message_id_for(run), f"{self.execution}:{part}",
                            seq, payload)

    async def start_runs(self) -> None:
        """Start a run on every thread: accepted, message start, text start."""
        for thread in self.threads:
            run = self.runs[thread]
            await self._send(thread, StreamOutput(run, 0, answer_message_id_for(run), "lifecycle",
                                                  0, RunLifecycle("run_accepted", "m", "")))
            await self._send(thread, self._output(thread, "message", MessageStart("assistant")))
            await self._send(thread, self._output(thread, "text:0", TextStart()))
        assert self._producer is not None
        await self._producer.flush()

    async def deltas(self, rate: float, seconds: float) -> int:
        """TextDelta records at `rate` per second in all, for `seconds`; how many were sent."""
        assert self._producer is not None
        count = int(rate * seconds)
        t0 = time.perf_counter()
        threads = self.threads
        for i in range(count):
            due = t0 + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            thread = threads[i % len(threads)]
            output = self._output(thread, "text:0", TextDelta(f"ts{time.time_ns()}"))
            meta = new_meta(thread, TENANT, int(time.time() * 1000))
            # The worker's _emit: encode, then send (its own clock read comes first too).
            await self._producer.send(self.settings.topics.stream, CODEC.encode_stream(output, meta),
                                      key=thread.encode(), headers=DELTA_HEADERS)
        await self._producer.flush()
        self.sent += count
        return count


# --- readers (helper processes) -------------------------------------------------------


def complete_frames(data: bytes) -> tuple[bytes, bytes]:
    """(the complete SSE frames at the start of `data`, the incomplete rest)."""
    cut = data.rfind(b"\n\n") + 2
    return data[:cut], data[cut:]


def _latencies_from(chunk: bytes, now_ns: int, out: list[float]) -> int:
    found = _DELTA_TS.findall(chunk)
    for ts in found:
        out.append((now_ns - int(ts)) / 1e6)
    return len(found)


async def sse_clients(base: str, threads: list[str], clients: int, seconds: float,
                      ready_file: Path | None, connect_parallel: int = 200) -> dict[str, Any]:
    """`clients` SSE connections over `threads` (round-robin); every delta's latency.

    Reads raw chunks and finds the timestamps with one regex, so that the clients
    cost little per event. Stops `seconds` after all are connected."""
    import aiohttp

    latencies: list[float] = []
    counts = {"events": 0, "connected": 0, "failed": 0}
    connected = asyncio.Event()
    stop = asyncio.Event()
    gate = asyncio.Semaphore(connect_parallel)
    headers = {"Authorization": "Bearer bench", "Accept": "text/event-stream"}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)

    async def client(session: aiohttp.ClientSession, thread: str) -> None:
        try:
            async with gate:
                response = await session.get(f"{base}/v1/threads/{thread}/stream",
                                             headers=headers)
                if response.status != 200:
                    counts["failed"] += 1
                    response.release()
                    return
                await response.content.readany()  # the retry frame: the stream is open
            counts["connected"] += 1
            if counts["connected"] + counts["failed"] == clients:
                connected.set()
            rest = b""
            async with response:
                while not stop.is_set():
                    chunk = await response.content.readany()
                    if not chunk:
                        return
                    whole, rest = complete_frames(rest + chunk)
                    counts["events"] += _latencies_from(whole, time.time_ns(), latencies)
        except (aiohttp.ClientError, OSError):
            counts["failed"] += 1
            if counts["connected"] + counts["failed"] == clients:
                connected.set()

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(client(session, threads[i % len(threads)]))
                 for i in range(clients)]
        t0 = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(connected.wait(), 240)
        connect_s = time.monotonic() - t0
        if ready_file is not None:
            ready_file.write_text(json.dumps(counts))
        await asyncio.sleep(seconds)
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"latencies": latencies, "connect_s": connect_s, **counts}


def direct_consumer(settings: Settings, seconds: float, ready_file: Path | None) -> dict[str, Any]:
    """A confluent-kafka consumer of the stream topic from its end, read_committed
    like the gateway's feed; every delta's latency."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"d{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 100, "log_level": 0})
    topic = settings.topics.stream
    parts = [TopicPartition(topic, p) for p in range(settings.partitions)]
    ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
    consumer.assign([TopicPartition(topic, p, o) for p, o in enumerate(ends)])
    latencies: list[float] = []
    if ready_file is not None:
        ready_file.write_text("{}")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # poll, not consume(n, timeout): that waits for n records or the whole timeout.
        msg = consumer.poll(0.1)
        if msg is None or msg.error() is not None:
            continue
        now = time.time_ns()
        _, output = CODEC.decode_stream(msg.value() or b"")
        payload = output.payload
        if isinstance(payload, TextDelta) and payload.delta.startswith("ts"):
            latencies.append((now - int(payload.delta[2:])) / 1e6)
    consumer.close()
    return {"latencies": latencies, "events": len(latencies)}


def main() -> None:
    """Run one reader (`sse` or `direct`) for the given seconds and write its timings."""
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["sse", "direct"])
    parser.add_argument("--base", default="")
    parser.add_argument("--threads-file", default="")
    parser.add_argument("--clients", type=int, default=0)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--ready", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    ready = Path(args.ready) if args.ready else None
    if args.role == "sse":
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        threads = json.loads(Path(args.threads_file).read_text())
        result = asyncio.run(sse_clients(args.base, threads, args.clients, args.seconds, ready))
    else:
        result = direct_consumer(Settings.from_env(), args.seconds, ready)
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
