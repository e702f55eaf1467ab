"""kill -9 the processor mid-burst, against the real broker: no decision is
duplicated and no command is lost, whether the same instance restarts or a
second instance takes its partitions over."""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from streams.config import Settings
from streams.domain import (
    CreateThread,
    MessageAccepted,
    PostUserMessage,
    ReportAttemptCompleted,
    ReportAttemptStarted,
    RunAccepted,
    RunCompleted,
    ThreadCreated,
)
from streams.serialization import decode_event
from streams.thread import run_id_for
from streams.topics import ensure_topics
from tests.kafka_helpers import (
    RoleProcess,
    command_producer,
    flush_all,
    marked,
    read_topic,
    send_command,
    send_marker,
)

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


def _audit(settings: Settings, expected: list[tuple[str, str]]) -> None:
    runs = {run_id_for(t, m) for t, m in expected}

    def complete(events: Sequence[object]) -> bool:
        return {e.run_id for e in events if isinstance(e, RunCompleted)} >= runs

    read_topic(settings, settings.topics.events, lambda b: decode_event(b)[1],
               until=complete, timeout=90)
    # A marker on every thread: once each is decided, every command sent before it
    # was too, and anything duplicated has landed (not a sleep that hopes so).
    producer = command_producer(settings)
    markers = marked(*(send_marker(producer, settings, t) for t in {t for t, _ in expected}))
    events = read_topic(settings, settings.topics.events, lambda b: decode_event(b)[1],
                        until=lambda es: complete(es) and markers(es), timeout=90)
    created = collections.Counter(e.thread_id for e in events if isinstance(e, ThreadCreated))
    accepted = collections.Counter(e.message_id for e in events if isinstance(e, MessageAccepted))
    started = collections.Counter(e.run_id for e in events if isinstance(e, RunAccepted))
    completed = collections.Counter(e.run_id for e in events if isinstance(e, RunCompleted))
    assert set(completed) == runs, f"lost: {len(runs - set(completed))} runs never completed"
    assert set(created.values()) == {1}, "a ThreadCreated was duplicated"
    assert set(created) == {t for t, _ in expected}
    assert set(accepted.values()) == {1} and len(accepted) == len(expected)
    assert set(started.values()) == {1}, "a run was started twice"
    assert set(completed.values()) == {1}, "a run has two stored answers"
    # Every decision is a pure function of its command: a duplicate of any kind
    # would show as two equal events.
    keys = collections.Counter(repr(e) for e in events)
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1][:3]


@pytest.mark.parametrize("seed", [1, 2])
def test_kill_9_and_restart_mid_burst_loses_and_duplicates_nothing(
    test_env: dict[str, str], tmp_path: Path, seed: int
) -> None:
    settings = Settings.from_env(test_env)
    ensure_topics(settings)
    proc = RoleProcess("processor", test_env, tmp_path / "p.log").start()
    expected: list[tuple[str, str]] = []
    sender = threading.Thread(target=lambda: expected.extend(_burst(settings, seed, 6.0)))
    try:
        sender.start()
        rng = random.Random(seed)
        for _ in range(2):
            time.sleep(rng.uniform(1.5, 2.5))
            proc.kill9()
            proc.start()
        sender.join()
        _audit(settings, expected)
    finally:
        sender.join()
        proc.stop()


def test_kill_9_with_a_second_instance_taking_over_loses_and_duplicates_nothing(
    test_env: dict[str, str], tmp_path: Path
) -> None:
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
        _audit(settings, expected)
        first.start()  # and a rebalance back: the returning instance restores from its checkpoint
        extra = _burst(settings, 8, 3.0)
        _audit(settings, expected + extra)
    finally:
        sender.join()
        first.stop()
        second.stop()
