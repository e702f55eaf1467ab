"""kill -9 the processor mid-burst, against the real broker: no decision is
duplicated and no command is lost, whether the same instance restarts or a
second instance takes its partitions over (and fences the transactional id of one
that died for good inside a transaction).

The kills are aimed at the window where exactly-once and at-least-once differ:
just as a batch's output becomes visible, before it is committed. The audit is
strict (each thread's events are exactly its life, in order; no `RunRejected`;
no envelope id twice), and a negative control runs the same burst and kills with
the processor in at-least-once mode and asserts that the audit finds the repeats.
"""

from __future__ import annotations

import collections
import random
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from streams.config import Settings
from streams.core.domain import (
    CreateThread,
    Event,
    MessageAccepted,
    PostUserMessage,
    ReportAttemptCompleted,
    ReportAttemptStarted,
    RunRejected,
    ThreadCreated,
)
from streams.core.ids import run_id_for
from streams.kafka.faults import FAULT_ENV, FAULT_EXIT_STATUS, arm
from streams.kafka.topics import ensure_topics
from streams.processor import instance_id_for
from streams.testing.process import RoleProcess
from streams.wire import Codec, EnvelopeMeta, new_meta
from tests.kafka_helpers import command_producer, flush_all, read_topic, send_command

CODEC = Codec()  # single-object records, as the roles write them without a registry

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]

THREADS = 30
MESSAGES = 2  # each: post, started, completed


def _burst(settings: Settings, seed: int, duration_s: float) -> list[tuple[str, str]]:
    """Publish every thread's whole life at a steady rate over `duration_s`."""
    rng = random.Random(seed)
    plan: dict[str, list[object]] = {}
    expected: list[tuple[str, str]] = []
    now = int(time.time() * 1000)
    for t in range(THREADS):
        thread = f"crash-{seed}-{t}"
        steps: list[object] = [CreateThread(thread, "t", f"thread {t}", now)]
        for m in range(MESSAGES):
            msg = f"{thread}-m{m}"
            run = run_id_for(thread, msg)
            steps += [
                PostUserMessage(thread, "t", msg, f"question {m}", None, now),
                ReportAttemptStarted(thread, run, 1, "w", now),
                ReportAttemptCompleted(thread, run, 1, "w", f"answer {t}/{m}", (), (), now),
            ]
            expected.append((thread, msg))
        plan[thread] = steps
    queues = {k: collections.deque(v) for k, v in plan.items()}
    total = sum(len(v) for v in plan.values())
    producer = command_producer(settings)
    pause = duration_s / total
    while queues:
        thread = rng.choice(sorted(queues))
        send_command(producer, settings, queues[thread].popleft())  # type: ignore[arg-type]
        if not queues[thread]:
            del queues[thread]
        producer.poll(0)
        time.sleep(pause)
    flush_all(producer)
    return expected


def _send_markers(settings: Settings, tag: str) -> set[str]:
    """One `CreateThread` per partition, sent after everything else: once each one's
    `ThreadCreated` is visible, so is everything decided before it on its partition,
    replays after a crash included (a replay precedes the marker in the log)."""
    producer = command_producer(settings)
    markers: set[str] = set()
    now = int(time.time() * 1000)
    for partition in range(settings.partitions):
        thread = f"marker-{tag}-{partition}"
        meta = new_meta(thread, "t", now)
        producer.produce(settings.topics.commands,
                         CODEC.encode_command(CreateThread(thread, "t", "m", now), meta),
                         thread.encode(), partition=partition)
        markers.add(thread)
    flush_all(producer)
    return markers


def _expected_life(thread: str, messages: list[str]) -> list[tuple[str, str]]:
    """A thread's whole events, in order, as (event type, message or run id)."""
    life = [("ThreadCreated", thread)]
    for msg in messages:
        run = run_id_for(thread, msg)
        life += [("MessageAccepted", msg), ("RunAccepted", run), ("AttemptDispatched", run),
                 ("AttemptStarted", run), ("RunCompleted", run)]
    return life


def _label(event: Event) -> tuple[str, str]:
    name = type(event).__name__
    if isinstance(event, ThreadCreated):
        return name, event.thread_id
    if isinstance(event, MessageAccepted | RunRejected):
        return name, event.message_id
    return name, str(getattr(event, "run_id", ""))


def audit(settings: Settings, expected: list[tuple[str, str]], markers: set[str]) -> list[str]:
    """Every problem in the events topic, read `read_committed` after the markers.

    Strict: each thread's events are exactly its expected life, in order. A command
    processed twice shows either as a repeated event (same derived envelope id) or,
    when its first result was already in the restored state, as a `RunRejected`
    duplicate or an extra event; at-least-once processing leaves one of these behind
    whenever a crash falls between its writes and its offset commit."""
    def all_markers(records: list[tuple[EnvelopeMeta, Event]]) -> bool:
        return markers <= {e.thread_id for _, e in records if isinstance(e, ThreadCreated)}

    records = read_topic(settings, settings.topics.events, CODEC.decode_event, until=all_markers, timeout=120)
    problems: list[str] = []
    if not all_markers(records):
        problems.append("the markers never came back: the processor stopped deciding")
    ids = collections.Counter(meta.envelope_id for meta, _ in records)
    repeated = [i for i, n in ids.items() if n > 1]
    if repeated:
        problems.append(f"{len(repeated)} events written twice (same envelope id), e.g. {repeated[:3]}")
    rejected = [e for _, e in records if isinstance(e, RunRejected)]
    if rejected:
        problems.append(f"{len(rejected)} RunRejected, e.g. {rejected[:2]}")
    lives: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for _, event in records:
        lives[event.thread_id].append(_label(event))
    by_thread: dict[str, list[str]] = collections.defaultdict(list)
    for thread, msg in expected:
        by_thread[thread].append(msg)
    for thread, messages in sorted(by_thread.items()):
        want, got = _expected_life(thread, messages), lives.pop(thread, [])
        if got != want:
            problems.append(f"{thread}: events {got} are not its life {want}")
    for thread in markers:
        if lives.pop(thread, []) != [("ThreadCreated", thread)]:
            problems.append(f"marker {thread}: not exactly one ThreadCreated")
    if lives:
        problems.append(f"events of unknown threads: {sorted(lives)[:3]}")
    return problems


def _kill_on_output(settings: Settings, proc: RoleProcess, rng: random.Random, kills: int) -> None:
    """Kill the processor `kills` times, each time just as a batch with a post in it
    becomes visible (read_uncommitted) on the events topic: inside its transaction
    under exactly-once; between its writes and its offset commit under at-least-once.
    That is the window where the two differ; a kill at a random moment mostly
    lands while the processor waits for input, where they do not."""
    events = settings.topics.events
    consumer = Consumer({
        "bootstrap.servers": settings.bootstrap, "group.id": f"killer-{uuid.uuid4()}",
        "isolation.level": "read_uncommitted", "enable.auto.commit": False,
        "fetch.wait.max.ms": 5, "log_level": 3,
    })
    partitions = [TopicPartition(events, p, 0) for p in range(settings.partitions)]
    consumer.assign(partitions)
    floor = dict.fromkeys(range(settings.partitions), 0)  # output of the killed process: skipped
    try:
        for kill in range(kills):
            if kill == 0:
                time.sleep(rng.uniform(1.0, 2.0))  # into the burst
            deadline = time.monotonic() + 120  # a failure bound, not a timing assertion
            while True:
                assert time.monotonic() < deadline, "the processor wrote no post's decision"
                msg = consumer.poll(0.05)
                if msg is None or msg.error() is not None:
                    continue
                _, partition, offset = msg.topic(), msg.partition(), msg.offset()
                assert partition is not None and offset is not None
                if offset >= floor[partition] and \
                        isinstance(CODEC.decode_event(msg.value() or b"")[1], MessageAccepted):
                    break
            proc.kill9()
            for tp in partitions:
                floor[tp.partition] = consumer.get_watermark_offsets(tp, timeout=10)[1]
            proc.start()
    finally:
        consumer.close()


def _fault_on_output(proc: RoleProcess, trigger: Path, prefix: str, kills: int) -> None:
    """End the processor `kills` times at its fault point (streams/kafka/faults.py):
    each time in the first step that writes a decision of the burst's threads,
    after its records reached the broker and before its offsets are committed.
    Not timed: every kill lands in the window where the two guarantees differ."""
    for _ in range(kills):
        arm(trigger, prefix)
        assert proc.wait(timeout=3600) == FAULT_EXIT_STATUS, proc.tail()  # the burst keeps it writing
        proc.start()


def _kill_9_and_restart_mid_burst(test_env: dict[str, str], tmp_path: Path, seed: int,
                                  kills: int = 3, fault: bool = False) -> list[str]:
    """The burst, with kills and restarts of the processor as it writes (SIGKILL, or
    with `fault` its fault point); the audit's problems."""
    settings = Settings.from_env(test_env)
    ensure_topics(settings)
    trigger = tmp_path / "fault-trigger"
    env = {**test_env, FAULT_ENV: str(trigger)} if fault else test_env
    proc = RoleProcess("processor", env, tmp_path / "p.log").start()
    expected: list[tuple[str, str]] = []
    sender = threading.Thread(target=lambda: expected.extend(_burst(settings, seed, 6.0)))
    try:
        sender.start()
        if fault:
            _fault_on_output(proc, trigger, f"crash-{seed}-", kills)
        else:
            _kill_on_output(settings, proc, random.Random(seed), kills)
        sender.join()
        return audit(settings, expected, _send_markers(settings, str(seed)))
    finally:
        sender.join()
        proc.stop()


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_9_and_restart_mid_burst_loses_and_duplicates_nothing(
    test_env: dict[str, str], tmp_path: Path, seed: int
) -> None:
    """A processor killed with SIGKILL mid-burst and restarted loses and duplicates no decision."""
    assert _kill_9_and_restart_mid_burst(test_env, tmp_path, seed) == []


def test_the_audit_catches_at_least_once_processing_under_the_same_kills(
    test_env: dict[str, str], tmp_path: Path
) -> None:
    """The negative control: the same burst with the processor in at-least-once
    mode, ended by its fault point between writing a batch and committing its
    offsets (a SIGKILL lands there only by chance), which repeats the batch. The
    audit must see it."""
    test_env["THREADLINE_PROCESSING_GUARANTEE"] = "at_least_once"
    problems = _kill_9_and_restart_mid_burst(test_env, tmp_path, 1, fault=True)
    assert problems, "the audit passed an at-least-once run"


def test_kill_9_with_a_second_instance_taking_over_loses_and_duplicates_nothing(
    test_env: dict[str, str], tmp_path: Path
) -> None:
    """When one of two processors is killed, the other takes over with no decision lost or doubled."""
    settings = Settings.from_env(test_env)
    ensure_topics(settings)
    env_b = {**test_env, "THREADLINE_DATA_DIR": str(tmp_path / "data-b")}
    first = RoleProcess("processor", test_env, tmp_path / "a.log").start()
    second = RoleProcess("processor", env_b, tmp_path / "b.log").start()
    expected: list[tuple[str, str]] = []
    sender = threading.Thread(target=lambda: expected.extend(_burst(settings, 7, 8.0)))
    try:
        sender.start()
        time.sleep(3.0)
        first.kill9()  # its partitions move to the second instance after the session timeout
        sender.join()
        markers = _send_markers(settings, "a")
        assert audit(settings, expected, markers) == []
        first.start()  # and a rebalance back: the returning instance restores from its checkpoint
        extra = _burst(settings, 8, 3.0)
        assert audit(settings, expected + extra, markers | _send_markers(settings, "b")) == []
    finally:
        sender.join()
        first.stop()
        second.stop()


def test_a_processor_lost_for_good_inside_a_transaction_is_fenced_by_the_one_taking_over(
    test_env: dict[str, str], tmp_path: Path
) -> None:
    """One of two processors ends inside a transaction (its fault point: records and
    offsets sent, no commit) and never comes back. The other takes its partitions
    over after the session timeout and fences its transactional id, which aborts the
    open transaction at once instead of after `transaction.timeout.ms`
    (streams/kafka/takeover.py); no decision is lost or doubled."""
    settings = Settings.from_env(test_env)
    ensure_topics(settings)
    trigger = tmp_path / "fault-trigger"
    first = RoleProcess("processor", {**test_env, FAULT_ENV: str(trigger)}, tmp_path / "a.log")
    env_b = {**test_env, "THREADLINE_DATA_DIR": str(tmp_path / "data-b")}
    second = RoleProcess("processor", env_b, tmp_path / "b.log")
    expected: list[tuple[str, str]] = []
    sender = threading.Thread(target=lambda: expected.extend(_burst(settings, 9, 6.0)))
    try:
        first.start().wait_for_log("restored in")
        second.start().wait_for_log("restored in")
        arm(trigger, "crash-9-")
        sender.start()
        assert first.wait(timeout=3600) == FAULT_EXIT_STATUS, first.tail()  # not restarted
        sender.join()
        assert audit(settings, expected, _send_markers(settings, "lost")) == []
        dead = f"{settings.topic_prefix}processor-{instance_id_for(settings)}"
        assert f"fenced {dead} " in second.output(), second.tail()
    finally:
        sender.join() if sender.is_alive() else None
        first.stop()
        second.stop()
