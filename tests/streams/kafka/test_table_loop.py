"""The table loop's ordering on a real broker: what runs in which order on a commit,
on an abort (and the rewind after it), and on a retried commit; and the watchdog.

A toy role copies each input record to an output topic. The producer and the
consumer are the real clients, subclassed only to write down each call (and to
fail one when a test says so).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from streams.config import Settings
from streams.kafka.clients import librdkafka_config, table_consumer_config, table_producer_config
from streams.kafka.loop import SLOW_TRANSACTION_S, Output, TableLoop, TransactionPhases
from streams.kafka.watchdog import HUNG_EXIT_STATUS

pytestmark = pytest.mark.kafka

Calls = list[str]


class RecordingProducer(Producer):
    """A producer that writes down its transactional calls and can fail one once."""

    def __init__(self, config: dict[str, Any], calls: Calls) -> None:
        super().__init__(config)
        self.calls = calls
        self.fail_once: dict[str, KafkaError] = {}  # call name -> the error it raises, once
        self.slow_once: dict[str, float] = {}  # call name -> seconds it sleeps first, once

    def _maybe_fail(self, name: str) -> None:
        self.calls.append(name)
        time.sleep(self.slow_once.pop(name, 0.0))
        error = self.fail_once.pop(name, None)
        if error is not None:
            raise KafkaException(error)

    def init_transactions(self, *args: Any) -> None:
        """Writes down "init", then initializes the transactions (fencing older producers)."""
        self.calls.append("init")
        super().init_transactions(*args)

    def begin_transaction(self, *args: Any) -> None:
        """Writes down "begin", then begins the transaction."""
        self.calls.append("begin")
        super().begin_transaction(*args)

    def produce(self, *args: Any, **kwargs: Any) -> None:
        """Writes down "produce", then produces the record."""
        self.calls.append("produce")
        super().produce(*args, **kwargs)

    def send_offsets_to_transaction(self, *args: Any) -> None:
        """Sends the offsets, then writes down "send_offsets" and raises its injected error if one is set."""
        super().send_offsets_to_transaction(*args)
        self._maybe_fail("send_offsets")

    def commit_transaction(self, *args: Any) -> None:
        """Writes down "commit" and raises its injected error if one is set, else commits."""
        self._maybe_fail("commit")
        super().commit_transaction(*args)

    def abort_transaction(self, *args: Any) -> None:
        """Writes down "abort", then aborts the transaction."""
        self.calls.append("abort")
        super().abort_transaction(*args)


class RecordingConsumer(Consumer):
    """A consumer that writes down its seeks."""

    def __init__(self, config: dict[str, Any], calls: Calls) -> None:
        super().__init__(config)
        self.calls = calls

    def seek(self, partition: TopicPartition) -> None:
        """Writes down "seek {partition}@{offset}", then seeks."""
        self.calls.append(f"seek {partition.partition}@{partition.offset}")
        super().seek(partition)


class CopyRole:
    """Copies each input record to `out`; writes down the loop's calls to it."""

    def __init__(self, out: str, calls: Calls) -> None:
        self.out, self.calls = out, calls
        self.staged: list[bytes] = []
        self.table: list[bytes] = []  # what committed steps applied
        self.owned: set[int] = set()

    def assigned(self, partitions: list[int]) -> None:
        """Writes down the assigned partitions and owns them."""
        self.calls.append(f"assigned {partitions}")
        self.owned.update(partitions)

    def revoked(self, partitions: list[int]) -> None:
        """Stops owning the revoked partitions."""
        self.owned.difference_update(partitions)

    def process(self, records: list[Message]) -> list[Output]:
        """Writes down "process {n}" for a batch, stages its values, and returns a `copy:` of each."""
        if records:
            self.calls.append(f"process {len(records)}")
        self.staged = [m.value() or b"" for m in records]
        return [Output(self.out, m.key() or b"", b"copy:" + (m.value() or b""), m.partition() or 0)
                for m in records]

    def committed(self) -> None:
        """Writes down "committed" and applies the staged values to the table."""
        self.calls.append("committed")
        self.table += self.staged

    def aborted(self, error: KafkaError) -> float:
        """Writes down "aborted {error}", drops the staged values, and asks for no backoff."""
        self.calls.append(f"aborted {error.name()}")
        self.staged = []
        return 0.0

    def after_step(self) -> None:
        """Nothing to do between steps."""
        pass


def _topics(settings: Settings) -> tuple[str, str]:
    source, out = f"{settings.topic_prefix}loop-in", f"{settings.topic_prefix}loop-out"
    admin = AdminClient(librdkafka_config(settings))
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in (source, out)]).values():
        future.result()
    return source, out


def _send(settings: Settings, topic: str, values: list[bytes]) -> None:
    producer = Producer(librdkafka_config(settings))
    for value in values:
        producer.produce(topic, value, b"k", partition=0)
    assert producer.flush(30) == 0


def _read_committed(settings: Settings, topic: str) -> list[bytes]:
    reader = Consumer(librdkafka_config(settings, **{
        "group.id": f"check-{uuid.uuid4()}", "isolation.level": "read_committed",
        "enable.partition.eof": True}))
    reader.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    try:
        while True:
            msg = reader.poll(10)
            assert msg is not None, "no end of partition within 10 s"
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF
                return values
            values.append(msg.value() or b"")
    finally:
        reader.close()


class FencedAsItJoinsConsumer(RecordingConsumer):
    """A consumer that fences its loop's transactional id as it joins the group: an
    instance restarting as itself while the one that took its partitions over fences
    it (streams/kafka/takeover.py), at the worst moment, after the process started."""

    def __init__(self, config: dict[str, Any], calls: Calls, fence: Callable[[], None]) -> None:
        super().__init__(config, calls)
        self.fence = fence

    def subscribe(self, *args: Any, **kwargs: Any) -> None:
        """Writes down "fenced" after fencing the loop's transactional id, then subscribes."""
        self.fence()
        self.calls.append("fenced")
        super().subscribe(*args, **kwargs)


def _run(settings: Settings, fail: dict[str, KafkaError], until: Callable[[CopyRole], bool],
         *, fenced_as_it_joins: bool = False, slow: dict[str, float] | None = None,
         phases: list[TransactionPhases] | None = None) -> tuple[Calls, CopyRole, TableLoop, str]:
    source, out = _topics(settings)
    _send(settings, source, [b"a", b"b", b"c"])
    calls: Calls = []
    group = f"{settings.topic_prefix}loop"
    transactional_id = f"{group}-1"
    def new_producer() -> RecordingProducer:
        return RecordingProducer(table_producer_config(
            settings, "loop-test", transactional_id=transactional_id, linger_ms=1), calls)

    producer = new_producer()
    producer.fail_once.update(fail)
    producer.slow_once.update(slow or {})
    role = CopyRole(out, calls)
    config = table_consumer_config(settings, group, "loop-test")
    consumer = RecordingConsumer(config, calls) if not fenced_as_it_joins else \
        FencedAsItJoinsConsumer(config, calls, lambda: _fence(settings, transactional_id))
    # As the processor builds it: a new producer at the first assignment and after a
    # timed-out call; without one (the connector relay), only at start.
    loop = TableLoop(role, consumer, producer, source,
                     producer_factory=new_producer if fenced_as_it_joins else None)
    if phases is not None:
        loop.on_commit = lambda _took, took: phases.append(took)
    deadline = time.monotonic() + 60
    try:
        loop.run(lambda: until(role) or time.monotonic() > deadline)
    finally:
        loop.close()
    return calls, role, loop, out


def _fence(settings: Settings, transactional_id: str) -> None:
    """What a takeover does to a deposed writer: `init_transactions` with its id."""
    fencer = Producer(table_producer_config(settings, "fencer", transactional_id=transactional_id,
                                            linger_ms=0))
    fencer.init_transactions(30)
    fencer.flush(0)


def _committed_offset(settings: Settings, topic: str) -> int:
    consumer = Consumer(table_consumer_config(settings, f"{settings.topic_prefix}loop", "check"))
    try:
        [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return int(tp.offset)
    finally:
        consumer.close()


def _steps(calls: Calls) -> list[Calls]:
    """The calls split into steps, each starting at a `process`."""
    steps: list[Calls] = []
    for call in calls:
        if call.startswith("process"):
            steps.append([])
        if steps:
            steps[-1].append(call)
    return steps


def test_a_step_commits_the_transaction_before_the_role_applies_it(settings: Settings) -> None:
    """Shows a step's order (process, begin, produce, send offsets, commit, then apply) and nothing lost."""
    calls, role, _, out = _run(settings, {}, lambda r: len(r.table) >= 3)
    assert calls[:2] == ["init", "assigned [0]"]
    for step in _steps(calls):
        n = int(step[0].split()[1])
        assert step == [f"process {n}", "begin", *["produce"] * n, "send_offsets", "commit", "committed"]
    assert role.table == [b"a", b"b", b"c"]
    assert _read_committed(settings, out) == [b"copy:a", b"copy:b", b"copy:c"]
    assert _committed_offset(settings, f"{settings.topic_prefix}loop-in") == 3


def test_an_aborted_step_is_rewound_and_processed_again_once(settings: Settings) -> None:
    """Shows an aborted step is aborted, rewound, processed again, and written and applied only once."""
    abortable = KafkaError(KafkaError.CONCURRENT_TRANSACTIONS, "injected", txn_requires_abort=True)
    calls, role, _, out = _run(settings, {"send_offsets": abortable}, lambda r: len(r.table) >= 3)
    first = calls.index("send_offsets")
    assert calls[first:first + 4] == ["send_offsets", "abort", "seek 0@0", "aborted CONCURRENT_TRANSACTIONS"]
    assert "committed" not in calls[:first + 4]
    assert calls[first + 4].startswith("process")  # the same records again
    assert role.table == [b"a", b"b", b"c"]
    assert _read_committed(settings, out) == [b"copy:a", b"copy:b", b"copy:c"]  # nothing twice
    assert _committed_offset(settings, f"{settings.topic_prefix}loop-in") == 3


def test_a_retriable_commit_error_is_retried(settings: Settings) -> None:
    """Shows a retriable commit error is followed by another commit, not an abort, and nothing twice."""
    retriable = KafkaError(KafkaError._TIMED_OUT, "injected", retriable=True)
    calls, _, _, out = _run(settings, {"commit": retriable}, lambda r: len(r.table) >= 3)
    first = calls.index("commit")
    assert calls[first:first + 3] == ["commit", "commit", "committed"]
    assert "abort" not in calls
    assert _read_committed(settings, out) == [b"copy:a", b"copy:b", b"copy:c"]


def test_a_fatal_error_propagates(settings: Settings) -> None:
    """Shows a fatal transaction error is raised out of the loop's run."""
    fatal = KafkaError(KafkaError._FENCED, "injected", fatal=True)
    with pytest.raises(KafkaException, match="injected"):
        _run(settings, {"send_offsets": fatal}, lambda r: False)


def test_a_slow_transaction_is_logged_with_where_its_time_went(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """Shows a transaction past SLOW_TRANSACTION_S is logged with its phases, and every
    committed one is timed phase by phase (the commit here sleeps past the limit; on a
    busy machine others may be logged too, and each must name its phases)."""
    phases: list[TransactionPhases] = []
    with caplog.at_level(logging.WARNING, logger="threadline.kafka.loop"):
        _run(settings, {}, lambda r: len(r.table) >= 3, slow={"commit": SLOW_TRANSACTION_S + 0.1},
             phases=phases)
    slow = [r.getMessage() for r in caplog.records if "a transaction took" in r.getMessage()]
    # A busy machine may make another transaction slow too: find the one slowed here.
    pattern = re.compile(r"begin and produce \d+, send offsets \d+, commit (\d+) \(\d+ records "
                         r"written, 1 offsets\)")
    commits_ms = [int(m.group(1)) for m in map(pattern.search, slow) if m is not None]
    assert len(commits_ms) == len(slow), slow  # every slow one is logged with its phases
    assert max(commits_ms, default=0) >= SLOW_TRANSACTION_S * 1000, slow
    assert phases and max(p.commit for p in phases) > SLOW_TRANSACTION_S
    assert all(min(p) >= 0 for p in phases)


def test_a_fence_before_the_first_assignment_costs_a_restarting_instance_nothing(
        settings: Settings) -> None:
    """Shows an instance fenced after it started but before it joined carries on. It
    calls `init_transactions` at start (what its crashed self left open is aborted
    before it joins: another member's assignment may be waiting for that), and on a
    new producer at its first assignment, after any fence a takeover could still
    make. With the first call alone the fence made its first commit fail fatally
    (chaos saw restarted processors exit by themselves); with the second alone, a
    member waiting for the open transaction and this one waiting for its assignment
    stalled each other for 60 s (chaos seed 604)."""
    calls, role, _, out = _run(settings, {}, lambda r: len(r.table) >= 3, fenced_as_it_joins=True)
    assert calls[:4] == ["init", "fenced", "init", "assigned [0]"]
    assert role.table == [b"a", b"b", b"c"]
    assert _read_committed(settings, out) == [b"copy:a", b"copy:b", b"copy:c"]
    assert _committed_offset(settings, f"{settings.topic_prefix}loop-in") == 3


def test_the_watchdog_ends_a_call_that_hangs_past_its_limit() -> None:
    """Shows the watchdog ends a process whose guarded call hangs past its limit, with HUNG_EXIT_STATUS."""
    code = ("import time\nfrom streams.kafka.watchdog import Watchdog\n"
            "with Watchdog(0.5).guard('a call'):\n    time.sleep(30)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == HUNG_EXIT_STATUS
    assert time.monotonic() - started < 10
    assert "a call hung past its timeout" in done.stderr


def test_the_watchdog_waits_while_the_broker_is_down(tmp_path: Path) -> None:
    """A call overdue while the broker is down goes on when it is back (librdkafka
    #5456): the watchdog asks its probe and waits; once the broker answers for its
    grace time and the call still hangs, it ends the process."""
    flag = tmp_path / "broker-up"
    code = ("import sys, time, pathlib\nfrom streams.kafka.watchdog import Watchdog\n"
            f"flag = pathlib.Path({str(flag)!r})\n"
            "def probe():\n    print('probed', flag.exists(), flush=True)\n    return flag.exists()\n"
            "with Watchdog(0.5, probe, grace_s=0.5).guard('a call'):\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        for _ in range(2):  # overdue, asked twice while the broker is down: still running
            assert proc.stdout.readline() == "probed False\n", proc.stderr.read() if proc.stderr else ""
        flag.touch()
        assert proc.wait(timeout=60) == HUNG_EXIT_STATUS
    finally:
        proc.kill()
        proc.wait()
