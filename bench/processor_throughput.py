"""Processor throughput: commands per second through the Threadline processor
(exactly-once and at-least-once), against a bare confluent-kafka transactional
consume -> decide -> produce loop running the same pure core, on the same broker
and the same pre-loaded payload, in one run."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from bench.common import CpuClock, fresh_settings
from streams.config import Settings
from streams.domain import (
    Command,
    CreateThread,
    PostUserMessage,
    ReportAttemptCompleted,
    ReportAttemptStarted,
    ThreadState,
)
from streams.processor import Processor
from streams.serialization import decode_command, encode_command, encode_event, new_meta
from streams.thread import apply, decide, run_id_for


@dataclass
class Result:
    """`wall_s` runs from the first batch to the last, so group joins and table
    restores at start-up are not counted; `cpu_s` is the whole process's CPU
    over the run, start-up included."""

    name: str
    commands: int
    wall_s: float
    cpu_s: float

    @property
    def per_s(self) -> float:
        return self.commands / self.wall_s

    @property
    def cpu_us_per_command(self) -> float:
        return self.cpu_s / self.commands * 1e6


def payload(threads: int, messages: int) -> list[Command]:
    now = int(time.time() * 1000)
    out: list[Command] = []
    for t in range(threads):
        thread = f"bench-{t}"
        out.append(CreateThread(thread, "bench", f"thread {t}", now))
    for m in range(messages):
        for t in range(threads):
            thread, msg = f"bench-{t}", f"m{m}"
            run = run_id_for(thread, msg)
            out += [
                PostUserMessage(thread, "bench", msg, f"question {m} " * 8, None, now),
                ReportAttemptStarted(thread, run, 1, "w", now),
                ReportAttemptCompleted(thread, run, 1, "w", f"answer {m} " * 40, (), (), now),
            ]
    return out


def preload(settings: Settings, commands: list[Command]) -> int:
    producer = Producer({"bootstrap.servers": settings.bootstrap, "partitioner": "murmur2_random",
                         "linger.ms": 20, "enable.idempotence": True})
    for command in commands:
        meta = new_meta(command.thread_id, "bench", 0)
        producer.produce(settings.topics.commands, encode_command(command, meta),
                         command.thread_id.encode())
        producer.poll(0)
    producer.flush(60)
    return len(commands)


def _drained(settings: Settings, group: str) -> bool:
    probe = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": group, "log_level": 0,
                      "isolation.level": "read_committed"})
    try:
        parts = [TopicPartition(settings.topics.commands, p) for p in range(settings.partitions)]
        try:
            committed = probe.committed(parts, timeout=10)
        except KafkaException:  # coordinator moving or loading: not yet
            return False
        for tp in committed:
            _, high = probe.get_watermark_offsets(tp, timeout=10)
            if tp.offset < high:
                return False
        return True
    finally:
        probe.close()


def run_threadline(settings: Settings, count: int, name: str) -> Result:
    processor = Processor(settings)
    worker = threading.Thread(target=processor.run, daemon=True)
    with CpuClock() as clock:
        worker.start()
        while not _drained(settings, processor.group_id):
            time.sleep(0.05)
    processor.stopping = True
    worker.join(30)
    stats = processor.stats
    assert stats.commands == count and stats.first_batch_at and stats.last_batch_at
    return Result(name, count, stats.last_batch_at - stats.first_batch_at, clock.cpu)


def run_bare_loop(settings: Settings, count: int) -> Result:
    """The least a transactional processor can do: consume, decide with the pure
    core on in-memory state, produce the events, commit offsets in the transaction."""
    group = f"{settings.topic_prefix}bare"
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "log_level": 0})
    producer = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 2,
                         "transactional.id": f"{group}-1", "log_level": 0})
    producer.init_transactions(30)
    consumer.subscribe([settings.topics.commands])
    states: dict[str, ThreadState | None] = {}
    done = 0
    first_batch_at = 0.0
    with CpuClock() as clock:
        while done < count:
            batch = consumer.consume(500, 0.05)
            if not batch:
                continue
            first_batch_at = first_batch_at or time.monotonic()
            producer.begin_transaction()
            offsets: dict[int, int] = {}
            for msg in batch:
                if msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                meta, command = decode_command(msg.value() or b"")
                events = decide(states.get(meta.thread_id), command, settings.policy)
                if events:
                    states[meta.thread_id] = apply(states.get(meta.thread_id), events)
                for event in events:
                    producer.produce(settings.topics.events, encode_event(event, meta),
                                     msg.key(), partition=msg.partition())
                offsets[msg.partition() or 0] = (msg.offset() or 0) + 1
                done += 1
            producer.send_offsets_to_transaction(
                [TopicPartition(settings.topics.commands, p, o) for p, o in offsets.items()],
                consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
    last_batch_at = time.monotonic()
    consumer.close()
    return Result("bare confluent-kafka EOS loop", count, last_batch_at - first_batch_at, clock.cpu)


def run(bootstrap: str, threads: int = 1000, messages: int = 3) -> list[Result]:
    commands = payload(threads, messages)
    results = []
    for name, env in (
        ("bare confluent-kafka EOS loop", None),
        ("threadline processor, exactly-once", {"THREADLINE_PROCESSING_GUARANTEE": "exactly_once"}),
        ("threadline processor, at-least-once", {"THREADLINE_PROCESSING_GUARANTEE": "at_least_once"}),
    ):
        settings = fresh_settings(bootstrap, **(env or {}))
        count = preload(settings, commands)
        if env is None:
            results.append(run_bare_loop(settings, count))
        else:
            results.append(run_threadline(settings, count, name))
    return results


if __name__ == "__main__":
    from bench.common import broker

    with broker() as bootstrap:
        for r in run(bootstrap):
            print(f"{r.name:40s} {r.per_s:9.0f} cmd/s  {r.cpu_us_per_command:7.1f} CPU µs/cmd")
