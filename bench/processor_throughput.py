"""Processor throughput: commands per second through the Threadline processor
(exactly-once and at-least-once), against bare confluent-kafka transactional
consume -> decide -> produce loops that run the same pure core, on the same broker
and the same pre-loaded commands, in one run.

Each case runs in a child process of its own (so its CPU is its own), on fresh
topics preloaded with the same commands; the cases are interleaved and repeated,
and the medians are reported. Two bare loops:

* "bare loop, events only": consume, decide and evolve on a dict, produce the
  events, commit the offsets in the transaction; the least an EOS processor does.
* "bare loop, same records": also writes everything the processor writes (the
  dispatches, the lifecycle mirror on the stream topic and each touched thread's
  state on the changelog), from the same encoders, but keeps state in a dict instead
  of RocksDB. The gap to it is the shell's own cost (tables, checks, bookkeeping).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.common import VAR, Figure, bench_env, cleanup, load_text, median, own_cpu
from streams.config import Settings
from streams.core.domain import (
    AttemptDispatched,
    Command,
    CreateThread,
    PostUserMessage,
    ReportAttemptCompleted,
    ReportAttemptStarted,
    StoredMessage,
    ThreadState,
)
from streams.core.history import MessagePut, RunStatusChanged, context_window, history_writes, message_key
from streams.core.ids import derived_envelope_id as _derived_id
from streams.core.ids import run_id_for
from streams.core.lifecycle import lifecycle_record as _lifecycle
from streams.core.records import Dispatch, MessageRecord
from streams.core.thread import decide, evolve
from streams.kafka.topics import ensure_topics
from streams.processor import Processor
from streams.wire import Codec, EnvelopeMeta, new_meta

CODEC = Codec()  # single-object records, as the roles write them without a registry

BENCH = "processor"
BARE = "bare loop, events only"
BARE_SAME = "bare loop, same records"
EOS = "threadline processor, exactly-once"
ALO = "threadline processor, at-least-once"
FAUST = "faust processor, exactly-once"
CASES = {BARE: "bare", BARE_SAME: "bare-same", EOS: "eos", ALO: "alo", FAUST: "faust"}


def payload(threads: int, messages: int) -> list[Command]:
    """A thread is created, then each message is posted, started and completed."""
    now = int(time.time() * 1000)
    out: list[Command] = []
    for t in range(threads):
        out.append(CreateThread(f"bench-{t}", "bench", f"thread {t}", now))
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


def encoded(commands: list[Command]) -> list[tuple[bytes, bytes]]:
    """The commands as (key, value) records, ready to produce."""
    return [(c.thread_id.encode(), CODEC.encode_command(c, new_meta(c.thread_id, "bench", 0)))
            for c in commands]


def preload(settings: Settings, records: list[tuple[bytes, bytes]]) -> None:
    """Write every record to the commands topic before the timed run."""
    producer = Producer({"bootstrap.servers": settings.bootstrap, "partitioner": "murmur2_random",
                         "linger.ms": 20, "enable.idempotence": True, "log_level": 0})
    for key, value in records:
        producer.produce(settings.topics.commands, value, key)
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("preload did not finish")


# --- the children ------------------------------------------------------------------


class _Meter:
    """Wall and CPU from the end of the first batch to the end of the last, so group
    joins and table restores at start-up are not counted."""

    def __init__(self) -> None:
        self.first_at = 0.0
        self.first_cpu = 0.0
        self.first_count = 0

    def first(self, count: int) -> None:
        if not self.first_at:
            self.first_at, self.first_cpu, self.first_count = time.monotonic(), own_cpu(), count

    def result(self, count: int) -> dict[str, Any]:
        wall, cpu = time.monotonic() - self.first_at, own_cpu() - self.first_cpu
        measured = count - self.first_count
        return {"commands": measured, "wall_s": wall, "cpu_s": cpu,
                "per_s": measured / wall, "cpu_us": cpu / measured * 1e6}


def _child_threadline(settings: Settings, count: int) -> dict[str, Any]:
    processor = Processor(settings)
    meter = _Meter()

    measured: dict[str, Any] = {}

    def watch() -> None:
        while processor.stats.commands < count:
            if processor.stats.batches and not meter.first_at:
                meter.first(processor.stats.commands)
            time.sleep(0.002)
        # Measured here, at the end of the last batch: the shutdown after it (leaving
        # the group, flushing and closing every table) is not per-command work.
        measured.update(meter.result(processor.stats.commands))
        processor.stopping = True

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    processor.run()
    watcher.join()
    result = measured
    result.update(batches=processor.stats.batches, aborts=processor.stats.aborts)
    return result


def _child_bare(settings: Settings, count: int, same_records: bool) -> dict[str, Any]:
    topics = settings.topics
    group = f"{settings.topic_prefix}bare"
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "fetch.wait.max.ms": 20,
                         "log_level": 0})
    producer = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 2,
                         "transactional.id": f"{group}-1", "log_level": 0})
    producer.init_transactions(30)
    consumer.subscribe([topics.commands])
    states: dict[bytes, ThreadState | None] = {}
    histories: dict[bytes, list[StoredMessage]] = {}
    meter = _Meter()
    done = batches = 0
    while done < count:
        batch = consumer.consume(500, 0.05)
        if not batch:
            continue
        producer.begin_transaction()
        offsets: dict[int, int] = {}
        touched: dict[tuple[int, bytes], ThreadState] = {}
        for msg in batch:
            if msg.error() is not None:
                continue
            key, partition = msg.key() or b"", msg.partition() or 0
            meta, command = CODEC.decode_command(msg.value() or b"")
            state = states.get(key)
            events = decide(state, command, settings.policy)
            offsets[partition] = (msg.offset() or 0) + 1
            done += 1
            if not events:
                continue
            new_state, before = state, state
            thread_history = histories.setdefault(key, [])
            for index, event in enumerate(events):
                new_state = evolve(before, event, settings.policy)
                event_meta = meta
                if same_records:
                    event_meta = EnvelopeMeta(_derived_id(meta.envelope_id, index), meta.thread_id,
                                              meta.tenant, int(time.time() * 1000),
                                              meta.traceparent, meta.tracestate)
                producer.produce(topics.events, CODEC.encode_event(event, event_meta), key,
                                 partition=partition)
                if not same_records or new_state is None:
                    before = new_state
                    continue
                # The same records as the processor, its history kept in memory instead
                # of in a RocksDB table.
                for write in history_writes(before, event):
                    if isinstance(write, MessagePut):
                        record = MessageRecord(write.seq, write.message, write.run_status)
                        thread_history.append(write.message)
                    elif isinstance(write, RunStatusChanged) and write.seq < len(thread_history):
                        record = MessageRecord(write.seq, thread_history[write.seq],
                                               write.run_status, write.run_attempts)
                    else:
                        continue
                    producer.produce(topics.messages, CODEC.encode_message(record, event_meta),
                                     message_key(meta.thread_id, record.seq), partition=partition)
                if isinstance(event, AttemptDispatched) and new_state.active_run is not None:
                    seq = new_state.active_run.message_seq
                    context = context_window(reversed(thread_history[:seq]),
                                             settings.worker.context_chars, 50)
                    dispatch = Dispatch(event.run_id, event.message_id, event.attempt,
                                        f"agent-{new_state.thread_id}", thread_history[seq].text,
                                        context, event.at_ms)
                    producer.produce(topics.dispatch, CODEC.encode_dispatch(dispatch, event_meta), key,
                                     partition=partition)
                lifecycle = _lifecycle(event, before)
                if lifecycle is not None:
                    producer.produce(topics.stream, CODEC.encode_stream(lifecycle, event_meta), key,
                                     partition=partition)
                before = new_state
            states[key] = new_state
            if same_records and new_state is not None:
                touched[(partition, key)] = new_state
        for (partition, key), state in touched.items():
            producer.produce(topics.threads, CODEC.encode_state(state), key, partition=partition)
        producer.send_offsets_to_transaction(
            [TopicPartition(topics.commands, p, o) for p, o in offsets.items()],
            consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        batches += 1
        meter.first(done)
    result = meter.result(done)
    result.update(batches=batches, aborts=0)
    consumer.close()
    return result


def child_main(argv: list[str] | None = None) -> None:
    """The timed child: consume the preloaded commands with one loop case and write its result."""
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=sorted(CASES.values()))
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    ensure_topics(settings)
    if args.case in ("eos", "alo"):
        result = _child_threadline(settings, args.count)
    else:
        result = _child_bare(settings, args.count, args.case == "bare-same")
    Path(args.out).write_text(json.dumps(result))


# --- the benchmark -----------------------------------------------------------------


def run_case(bootstrap: str, case: str, records: list[tuple[bytes, bytes]],
             folder: Path) -> dict[str, Any]:
    """Preload the commands and time one case in a child process."""
    from bench.common import run_child_json

    guarantee = "at_least_once" if case == ALO else "exactly_once"
    env = bench_env(bootstrap, THREADLINE_PROCESSING_GUARANTEE=guarantee)
    settings = Settings.from_env(env)
    ensure_topics(settings)
    preload(settings, records)
    load = load_text()
    try:
        module, args = "bench.processor_throughput", ["child", CASES[case]]
        if case == FAUST:
            module, args = "bench.faust_processor", []
        result = run_child_json(module, [*args, "--count", str(len(records))], env,
                                folder / f"{CASES[case]}-{settings.topic_prefix}log", 300)
    finally:
        cleanup(settings)
    result["load"] = load
    return result


def run(bootstrap: str, threads: int = 1000, messages: int = 3, repeats: int = 3,
        cases: tuple[str, ...] = (BARE, BARE_SAME, EOS, ALO, FAUST)) -> list[Figure]:
    """Throughput and CPU per command of every case, repeated, as figures."""
    records = encoded(payload(threads, messages))
    folder = VAR / "bench-logs"
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
    for repeat in range(repeats):
        for case in cases:
            if case == FAUST and repeat > 0:
                continue  # one Faust run: at ~100-200 cmd/s it takes longer than the rest
            result = run_case(bootstrap, case, records, folder)
            runs[case].append(result)
            print(f"  [{repeat + 1}/{repeats}] {case:38s} {result['per_s']:8.0f} cmd/s "
                  f"{result['cpu_us']:7.1f} CPU µs/cmd  (load {result['load']})", flush=True)
    figures = []
    for case in cases:
        rates = [r["per_s"] for r in runs[case]]
        cpu = [r["cpu_us"] for r in runs[case]]
        values = {"cmd/s": median(rates), "CPU µs/cmd": median(cpu), "runs": len(rates)}
        base = None if case in (BARE, BARE_SAME) else BARE
        figures.append(Figure(BENCH, case, values, base, {"processor": median(cpu)},
                              " / ".join(r["load"] for r in runs[case])))
    # Ratios round by round (the cases of a round run within a minute or two of each
    # other, under about the same load), then the median over the rounds.
    for f in figures:
        for base in (BARE, BARE_SAME):
            if base not in runs or f.case == base:
                continue
            pairs = zip(runs[f.case], runs[base], strict=False)
            f.values[f"x {base}"] = median([r["per_s"] / b["per_s"] for r, b in pairs])
        rounds = " | ".join(f"{r['per_s']:.0f}" for r in runs[f.case])
        f.note = f"cmd/s by round: {rounds}"
    return figures


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child_main(sys.argv[2:])
    else:
        from bench.common import broker

        with broker() as bootstrap:
            cases = tuple(c for c in CASES if CASES[c] in sys.argv[1:]) or tuple(CASES)
            for figure in run(bootstrap, repeats=1, cases=cases):
                print(figure.case, figure.values)
