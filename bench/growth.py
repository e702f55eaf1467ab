"""Growth: does a long thread cost more per turn than a short one?

Processor CPU per command and `POST -> 202` latency at turn 10 of a thread against
turn 1,000, measured side by side on one stack (`threadline processor` and
`threadline gateway`, each its own process; no worker: the bench reports each run
completed itself, as a worker would, so no answer streams and the figures are the
decision path's alone).

Threads are prepared with commands produced straight to Kafka: per turn a
`PostUserMessage` and the `ReportAttemptCompleted` of `run_id_for(thread, message_id)`,
pipelined (tests/streams/test_long_threads.py does the same): many at turn 10, six
at turn 1,000. A short thread gets at most five more turns, so its side is measured
on turns 11-15 (its history, and so the dispatch's context, still 20-28 messages);
the long side on turns 1,001-1,068. Round by round, so that a change of the
machine's load hits both alike:

* *CPU*: a burst of five turns on each of six fresh turn-10 threads, and the same
  on the six turn-1,000 threads, each produced while the processor is stopped
  (SIGSTOP), so it finds the burst queued and decides it in full batches; its CPU
  (the scheduler's nanoseconds, every thread of the process) from SIGCONT until
  the processor group's committed offset passes the last command.
* *latency*: one `POST /v1/threads/{id}/user_message` a side (the order alternates
  by round), each timed until its `202`, then the run completed and its decision
  awaited before the next post.

The gateway's memory and start-up at 1k against 100k threads are in
`bench.growth_gateway`; `run` measures both.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator

import aiohttp
from confluent_kafka import Consumer, Producer, TopicPartition

from bench.common import Figure, load_text, median, percentile, process_cpu_ns
from bench.stack import AUTH, Stack, new_stack
from gateway.http.ready import probe_thread_id
from gateway.kafka import partition_for
from streams.config import Settings
from streams.core.domain import CheckDeadlines, Command, CreateThread, PostUserMessage, ReportAttemptCompleted
from streams.core.ids import run_id_for
from streams.wire import Codec, new_meta

CODEC = Codec()  # single-object records, as the roles write them without a registry

BENCH = "growth"
TENANT = "bench"  # the tenant of the API key "bench" (bench_env)
SHORT_TURNS = 10
LONG_TURNS = 1_000
THREADS = 6  # threads a side of a CPU burst
TURNS_EACH = 5  # turns a thread in a burst (so the short threads stay at turns 11-15)
CPU_ROUNDS = 12  # a burst is 6 x 5 turns, 60 commands: one or two of the processor's batches
POST_ROUNDS = 40
WARMUP_POSTS = 3
QUESTION = "How does the offset of this answer relate to the one before it? " * 2  # 130 chars
ANSWER = "The offset grows by one per record on the partition, markers included. " * 8
SHORT, LONG = f"turn {SHORT_TURNS}", f"turn {LONG_TURNS:,}"


class Commands:
    """Produces commands straight to the commands topic and waits for the processor
    to have decided them: its group's committed offset (part of each transaction)
    past the last one produced."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.topics.commands
        self.producer = Producer({"bootstrap.servers": settings.bootstrap,
                                  "partitioner": "murmur2_random", "linger.ms": 2,
                                  "enable.idempotence": True, "log_level": 0})
        self.offsets = Consumer({"bootstrap.servers": settings.bootstrap,
                                 "group.id": f"{settings.topic_prefix}processor",
                                 "enable.auto.commit": False, "log_level": 0})
        self.last: dict[int, int] = {}  # partition -> offset of the last command produced

    def send(self, command: Command) -> None:
        """Produce one command to the commands topic."""
        meta = new_meta(command.thread_id, TENANT, int(time.time() * 1000))
        self.producer.produce(self.topic, CODEC.encode_command(command, meta),
                              command.thread_id.encode(), on_delivery=self._delivered)

    def _delivered(self, err: object, msg: object) -> None:
        if err is not None:
            raise RuntimeError(f"command not delivered: {err}")
        partition, offset = msg.partition(), msg.offset()  # type: ignore[attr-defined]
        self.last[partition] = max(offset, self.last.get(partition, -1))

    def decided(self, timeout: float = 120) -> None:
        """Flush, then wait until every command produced so far is decided."""
        if self.producer.flush(30):
            raise RuntimeError("commands not delivered in 30 s")
        waiting = dict(self.last)
        deadline = time.monotonic() + timeout
        while waiting:
            parts = [TopicPartition(self.topic, p) for p in waiting]
            for tp in self.offsets.committed(parts, timeout=10):
                if tp.offset > waiting[tp.partition]:
                    del waiting[tp.partition]
            if time.monotonic() > deadline:
                raise RuntimeError(f"not decided after {timeout} s: {waiting}")
            if waiting:
                time.sleep(0.002)

    def ready(self, timeout: float = 180) -> None:
        """Wait until the processor decides on every partition (a probe on each)."""
        now = int(time.time() * 1000)
        for p in range(self.settings.partitions):
            self.send(CheckDeadlines(probe_thread_id(p, self.settings.partitions), now))
        self.decided(timeout)

    def turns(self, thread: str, first: int, count: int) -> None:
        """`count` turns, pipelined: each post and at once its run's completion."""
        now = int(time.time() * 1000)
        for i in range(first, first + count):
            message_id = f"m-{i}"
            self.send(PostUserMessage(thread, TENANT, message_id, QUESTION, None, now))
            self.complete(thread, run_id_for(thread, message_id), now)

    def complete(self, thread: str, run_id: str, now: int | None = None) -> None:
        """Report a run's attempt 1 completed with the fixed answer."""
        self.send(ReportAttemptCompleted(thread, run_id, 1, "bench-worker", ANSWER, (), (),
                                         now or int(time.time() * 1000)))

    def close(self) -> None:
        """Flush the producer and close the offsets client."""
        self.producer.flush(10)
        self.offsets.close()


def same_partition_threads(prefix: str, partitions: int, count: int) -> Iterator[str]:
    """Thread ids all on partition 0: every measured command goes to one partition,
    so the short and the long thread share the processor's batches alike."""
    n = 0
    while count:
        thread = f"{prefix}-{n}-{uuid.uuid4().hex[:6]}"
        n += 1
        if partition_for(thread, partitions) == 0:
            count -= 1
            yield thread


def burst_cpu(kafka: Commands, pid: int, threads: list[str], first: int) -> float:
    """CPU µs per command of a burst (TURNS_EACH turns on each of `threads`) handed to
    the processor at once: it is stopped (SIGSTOP) while the burst is produced, so it
    finds every command queued when it resumes and decides them in full batches, the
    same on both sides, whatever the timing of the produce."""
    os.kill(pid, signal.SIGSTOP)
    try:
        for thread in threads:
            kafka.turns(thread, first, TURNS_EACH)
        if kafka.producer.flush(30):
            raise RuntimeError("commands not delivered in 30 s")
        start = process_cpu_ns(pid)
    finally:
        os.kill(pid, signal.SIGCONT)
    kafka.decided()
    return (process_cpu_ns(pid) - start) / 1e3 / (2 * TURNS_EACH * len(threads))


def _cpu_rounds(kafka: Commands, pid: int, shorts: list[str], longs: list[str]) \
        -> tuple[list[float], list[float]]:
    """Per round: CPU µs per command of a burst on fresh turn-10 threads and of one on
    the turn-1,000 threads."""
    short_cpu: list[float] = []
    long_cpu: list[float] = []
    for r in range(CPU_ROUNDS):
        fresh = shorts[r * THREADS:(r + 1) * THREADS]
        bursts = [(fresh, SHORT_TURNS, short_cpu),
                  (longs, LONG_TURNS + r * TURNS_EACH, long_cpu)]
        for threads, first, out in bursts if r % 2 == 0 else bursts[::-1]:
            out.append(burst_cpu(kafka, pid, threads, first))
        print(f"  [{r + 1}/{CPU_ROUNDS}] CPU µs/cmd {SHORT} {short_cpu[-1]:.0f}, "
              f"{LONG} {long_cpu[-1]:.0f}  (load {load_text()})", flush=True)
    return short_cpu, long_cpu


async def post_message(session: aiohttp.ClientSession, stack: Stack, thread: str) \
        -> tuple[float, str, str]:
    """Latency ms, run id, status ("accepted"; "pending" if the decision took longer
    than the gateway waits)."""
    started = time.perf_counter()
    async with session.post(f"{stack.base}/v1/threads/{thread}/user_message",
                            json={"input_text": QUESTION}, headers=AUTH) as response:
        body = await response.json()
        elapsed = (time.perf_counter() - started) * 1000
    if response.status != 202:
        raise RuntimeError(f"POST on {thread}: {response.status} {body}")
    return elapsed, str(body["run_id"]), str(body["status"])


async def _post_rounds(stack: Stack, kafka: Commands, shorts: list[str], longs: list[str]) \
        -> tuple[list[float], list[float], int]:
    """One post a side a round; a short thread takes TURNS_EACH posts (turns 11-15),
    then the next; the long threads take turns."""
    latencies: tuple[list[float], list[float]] = ([], [])
    pending = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for r in range(POST_ROUNDS + WARMUP_POSTS):
            sides = [(shorts[r // TURNS_EACH], latencies[0]), (longs[r % len(longs)], latencies[1])]
            for thread, out in sides if r % 2 == 0 else sides[::-1]:
                elapsed, run_id, status = await post_message(session, stack, thread)
                kafka.complete(thread, run_id)
                kafka.decided()
                if r >= WARMUP_POSTS:
                    out.append(elapsed)
                    pending += status != "accepted"
    return latencies[0], latencies[1], pending


async def wait_ready(stack: Stack, timeout: float = 180) -> None:
    """Wait until the gateway answers /readyz (a role that exits fails it)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            for name, child in stack.children.items():
                if not child.alive():
                    raise RuntimeError(f"{name} exited:\n{child.tail()}")
            try:
                async with session.get(f"{stack.base}/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"gateway not ready after {timeout} s")


def turns(bootstrap: str) -> list[Figure]:
    """Processor CPU per command and post latency at turn 10 against a long thread's later turns."""
    stack = new_stack(bootstrap).start(["processor", "gateway"])
    kafka = Commands(stack.settings)
    partitions = stack.settings.partitions
    post_threads = -(-(POST_ROUNDS + WARMUP_POSTS) // TURNS_EACH)
    try:
        kafka.ready()
        asyncio.run(wait_ready(stack))
        shorts = list(same_partition_threads("short", partitions,
                                              CPU_ROUNDS * THREADS + post_threads))
        longs = list(same_partition_threads("long", partitions, THREADS))
        now = int(time.time() * 1000)
        t0 = time.monotonic()
        for thread in [*shorts, *longs]:
            kafka.send(CreateThread(thread, TENANT, "growth", now))
        for thread in shorts:
            kafka.turns(thread, 0, SHORT_TURNS)
        for thread in longs:
            kafka.turns(thread, 0, LONG_TURNS)
        kafka.decided(600)
        print(f"  prepared {len(shorts)} threads at {SHORT} and {len(longs)} at {LONG} in "
              f"{time.monotonic() - t0:.1f} s", flush=True)
        pid = stack.children["processor"].pid
        idle0, idle_t0 = process_cpu_ns(pid), time.monotonic()
        time.sleep(2.0)
        idle_ms_per_s = (process_cpu_ns(pid) - idle0) / 1e6 / (time.monotonic() - idle_t0)
        load_cpu = load_text()
        short_cpu, long_cpu = _cpu_rounds(kafka, pid, shorts, longs)
        load_post = load_text()
        short_ms, long_ms, pending = asyncio.run(
            _post_rounds(stack, kafka, shorts[CPU_ROUNDS * THREADS:], longs))
        print(f"  POST -> 202 p50 {SHORT} {median(short_ms):.1f} ms, {LONG} "
              f"{median(long_ms):.1f} ms  (load {load_text()})", flush=True)
    finally:
        kafka.close()
        stack.stop()
    ratios = [b / a for a, b in zip(short_cpu, long_cpu, strict=True)]
    by_round = " | ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(short_cpu, long_cpu, strict=True))
    long_last = LONG_TURNS + CPU_ROUNDS * TURNS_EACH
    note = (f"CPU µs/cmd by round (turn 10 / turn 1,000): {by_round}; a burst is "
            f"{TURNS_EACH} turns on each of {THREADS} threads ({2 * TURNS_EACH * THREADS} "
            f"commands): turns {SHORT_TURNS + 1}-{SHORT_TURNS + TURNS_EACH} of fresh threads, "
            f"turns {LONG_TURNS + 1:,}-{long_last:,} of the long ones over the rounds (posts: "
            f"turns {long_last + 1:,}-{long_last + -(-(POST_ROUNDS + WARMUP_POSTS) // THREADS):,});"
            f" the processor idles at {idle_ms_per_s:.1f} ms CPU/s (in both sides' windows); "
            f"posts answered 'pending' (undecided within the gateway's wait): {pending}")
    figures = []
    for case, cpu, posts in ((SHORT, short_cpu, short_ms), (LONG, long_cpu, long_ms)):
        values = {"CPU µs/cmd": median(cpu), "POST p50 ms": median(posts),
                  "POST p95 ms": percentile(posts, 95), "POST p99 ms": percentile(posts, 99),
                  "posts": len(posts)}
        figures.append(Figure(BENCH, f"at {case}", values,
                              None if case == SHORT else f"at {SHORT}",
                              {"processor": median(cpu)}, f"{load_cpu} / {load_post}"))
    long_figure = figures[1]
    long_figure.values["x CPU µs/cmd"] = median(ratios)
    long_figure.values["x POST p50"] = median(long_ms) / median(short_ms)
    long_figure.values["x POST p99"] = percentile(long_ms, 99) / percentile(short_ms, 99)
    long_figure.note = note
    return figures


def run(bootstrap: str) -> list[Figure]:
    """The growth figures: the processor's per-turn costs, then the gateway's by thread count."""
    from bench import growth_gateway

    return [*turns(bootstrap), *growth_gateway.run(bootstrap)]


if __name__ == "__main__":
    from bench.common import broker

    with broker() as bootstrap:
        for figure in turns(bootstrap):
            print(figure.case, figure.values, figure.note)
