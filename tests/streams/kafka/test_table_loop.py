"""The table loop's ordering on a real broker: what runs in which order on a commit,
on an abort (and the rewind after it), on a retried commit and on a hung call; and
the watchdog.

A toy role copies each input record to an output topic. The producer and the
consumer are the real clients, subclassed only to write down each call (and to
fail one when a test says so).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from streams.config import Settings
from streams.kafka.clients import librdkafka_config, table_consumer_config, table_producer_config
from streams.kafka.loop import SLOW_TRANSACTION_S, Output, TableLoop, TransactionPhases, is_fatal
from streams.kafka.watchdog import HUNG_EXIT_STATUS, CallHung, Watchdog

pytestmark = pytest.mark.kafka

Calls = list[str]


class RecordingProducer(Producer):
    """A producer that writes down its transactional calls and can fail one once."""

    def __init__(self, config: dict[str, Any], calls: Calls) -> None:
        super().__init__(config)
        self.calls = calls
        self.fail_once: dict[str, KafkaError] = {}  # call name -> the error it raises, once
        self.slow_once: dict[str, float] = {}  # call name -> seconds it sleeps first, once
        # call name -> an event it blocks on first, once, past any timeout (librdkafka #5456)
        self.hang_once: dict[str, threading.Event] = {}
        self.hanging = threading.Event()  # set once a call hangs

    def _maybe_hang(self, name: str) -> None:
        release = self.hang_once.pop(name, None)
        if release is not None:
            self.calls.append(f"{name} hangs")
            self.hanging.set()
            release.wait()

    def _maybe_fail(self, name: str) -> None:
        self.calls.append(name)
        time.sleep(self.slow_once.pop(name, 0.0))
        error = self.fail_once.pop(name, None)
        if error is not None:
            raise KafkaException(error)

    def init_transactions(self, *args: Any) -> None:
        """Hangs if told to, after a hung `send_offsets` only; writes down "init", then
        initializes the transactions (fencing older producers)."""
        if "send_offsets hangs" in self.calls:
            self._maybe_hang("init")
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
        """Hangs if told to; sends the offsets, writes down "send_offsets", raises its injected error."""
        self._maybe_hang("send_offsets")
        super().send_offsets_to_transaction(*args)
        self._maybe_fail("send_offsets")

    def commit_transaction(self, *args: Any) -> None:
        """Hangs if told to; writes down "commit", raises its injected error or commits."""
        self._maybe_hang("commit")
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
         phases: list[TransactionPhases] | None = None, hang: dict[str, threading.Event] | None = None,
         then: Callable[[TableLoop, CopyRole, str], None] | None = None, factory: bool = False,
         ) -> tuple[Calls, CopyRole, TableLoop, str]:
    """The copy loop over a new topic holding a, b and c, until `until(role)`; `then`,
    if given, is called once, between steps, when a, b and c are in the table."""
    source, out = _topics(settings)
    _send(settings, source, [b"a", b"b", b"c"])
    calls: Calls = []
    group = f"{settings.topic_prefix}loop"
    transactional_id = f"{group}-1"
    hangs = dict(hang or {})  # shared: the first producer to make the call hangs in it
    hanging = threading.Event()

    def new_producer() -> RecordingProducer:
        made = RecordingProducer(table_producer_config(
            settings, "loop-test", transactional_id=transactional_id, linger_ms=1), calls)
        made.hang_once, made.hanging, made.fail_once = hangs, hanging, fails
        return made

    fails = dict(fail)  # shared too, as `hangs`
    producer = new_producer()
    producer.slow_once.update(slow or {})
    role = CopyRole(out, calls)
    config = table_consumer_config(settings, group, "loop-test")
    consumer = RecordingConsumer(config, calls) if not fenced_as_it_joins else \
        FencedAsItJoinsConsumer(config, calls, lambda: _fence(settings, transactional_id))
    # As the processor builds it: a new producer at each assignment and after a
    # timed-out call; without one (the connector relay), only at start.
    loop = TableLoop(role, consumer, producer, source,
                     producer_factory=new_producer if fenced_as_it_joins or hang or then or factory
                     else None)
    if hang:  # as if the broker were down but while the call hangs: a slow call is no hang
        def hung_now() -> bool:
            was = hanging.is_set()
            hanging.clear()
            return was

        loop.watchdog = Watchdog(0.3, hung_now, grace_s=0.0, poll_s=0.05)
    if phases is not None:
        loop.on_commit = lambda _took, took: phases.append(took)
    deadline = time.monotonic() + 60
    pending = [then] if then is not None else []

    def stop() -> bool:
        if pending and len(role.table) >= 3:
            pending.pop()(loop, role, transactional_id)
        return until(role) or time.monotonic() > deadline

    try:
        loop.run(stop)
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


def test_a_retriable_send_offsets_error_is_done_again_on_a_new_producer(settings: Settings) -> None:
    """Shows a retriable `send_offsets_to_transaction` error (a broker restart) with a
    producer factory: the batch is rewound and done again on a new producer, and the
    old one is not asked to abort (after a broker restart that abort failed fatally,
    INVALID_TXN_STATE: chaos seed 612); the new one's init_transactions aborts it."""
    transport = KafkaError(KafkaError._TRANSPORT, "injected", retriable=True)
    calls, role, _, out = _run(settings, {"send_offsets": transport}, lambda r: len(r.table) >= 3,
                               factory=True)
    failed = calls.index("send_offsets")
    assert calls[failed + 1:failed + 4] == ["init", "seek 0@0", "aborted _TRANSPORT"]
    assert calls[failed + 4].startswith("process")
    assert "abort" not in calls
    assert role.table == [b"a", b"b", b"c"]
    assert _read_committed(settings, out) == [b"copy:a", b"copy:b", b"copy:c"]  # nothing twice
    assert _committed_offset(settings, f"{settings.topic_prefix}loop-in") == 3


def _ends(settings: Settings, topic: str) -> tuple[int, int]:
    """The partition's last stable offset and its high watermark: below it while a
    transaction is open."""
    ends = []
    for isolation in ("read_committed", "read_uncommitted"):
        reader = Consumer(librdkafka_config(settings, **{
            "group.id": f"check-{uuid.uuid4()}", "isolation.level": isolation}))
        try:
            ends.append(int(reader.get_watermark_offsets(TopicPartition(topic, 0), 30)[1]))
        finally:
            reader.close()
    return ends[0], ends[1]


def test_a_transaction_a_failed_call_left_open_is_aborted_before_the_next_step(
        settings: Settings) -> None:
    """Shows the transaction of a `send_offsets_to_transaction` failed with a retriable
    error is aborted before the loop goes on, not at its next transaction: its
    partitions may be revoked first, and a transaction left open past that hid what
    their next owner committed from that owner's own next restore (chaos seed 3105:
    a state gone back, tool calls recorded twice). The loop is stopped right after
    the failed step, so no later transaction aborts it instead."""
    transport = KafkaError(KafkaError._TRANSPORT, "injected", retriable=True)
    calls, role, _, out = _run(settings, {"send_offsets": transport},
                               lambda r: any(c.startswith("aborted") for c in r.calls),
                               factory=True)
    stable, high = _ends(settings, out)
    assert high > 0 and stable == high, (stable, high)  # records written, then aborted
    assert calls[-3:] == ["init", "seek 0@0", "aborted _TRANSPORT"]
    assert role.table == []


def test_a_consumed_fatal_error_is_fatal_even_without_its_flag() -> None:
    """librdkafka delivers a fatal consumer error (a static member fenced) as a message
    with code _FATAL and the `fatal()` flag unset: seen in a CI run under load, the
    processor logged it and stalled for good. The loop must take it as fatal."""
    delivered = KafkaError(KafkaError._FATAL)
    assert not delivered.fatal()  # what librdkafka hands over
    assert is_fatal(delivered)
    assert not is_fatal(KafkaError(KafkaError._PARTITION_EOF))
    assert not is_fatal(KafkaError(KafkaError._TRANSPORT))


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


def test_a_hung_call_leaves_its_producer_behind_and_the_step_is_done_again_on_a_new_one(
        settings: Settings) -> None:
    """Shows a `send_offsets_to_transaction` hung past its timeout (librdkafka #5456
    after a broker restart) costs the process nothing but its producer: the hung
    producer is never called again (no abort), the batch is rewound and done again on
    a new producer, whose `init_transactions` fences the hung one and aborts its
    transaction; nothing is written twice."""
    release = threading.Event()
    try:
        calls, role, loop, out = _run(settings, {}, lambda r: len(r.table) >= 3,
                                      hang={"send_offsets": release})
    finally:
        release.set()  # the hung call goes on, on a fenced producer, and fails unheard
    hung = calls.index("send_offsets hangs")
    assert calls[hung + 1:hung + 4] == ["init", "seek 0@0", "aborted _TIMED_OUT"]  # a new producer
    assert calls[hung + 4].startswith("process")  # the same records again
    assert "abort" not in calls and "committed" not in calls[:hung]
    assert loop.watchdog.left_behind == 1
    assert role.table == [b"a", b"b", b"c"]
    assert _read_committed(settings, out) == [b"copy:a", b"copy:b", b"copy:c"]  # nothing twice
    assert _committed_offset(settings, f"{settings.topic_prefix}loop-in") == 3


def test_a_new_producer_that_hangs_in_turn_is_made_again_at_the_next_step(
        settings: Settings) -> None:
    """Shows the new producer made at once after a hung call may hang in its own
    `init_transactions`: the loop carries on, and the next step makes another; the
    batch is written once."""
    release = threading.Event()
    try:
        calls, role, loop, out = _run(settings, {}, lambda r: len(r.table) >= 3,
                                      hang={"send_offsets": release, "init": release})
    finally:
        release.set()
    hung = calls.index("send_offsets hangs")
    assert calls[hung + 1:hung + 4] == ["init hangs", "seek 0@0", "aborted _TIMED_OUT"]
    assert calls[hung + 4].startswith("process") and calls[hung + 5] == "init"
    assert loop.watchdog.left_behind == 2
    assert role.table == [b"a", b"b", b"c"]
    assert _read_committed(settings, out) == [b"copy:a", b"copy:b", b"copy:c"]  # nothing twice


class Exited(Exception):
    """What the loop's `os._exit` raises in a test."""


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's `os._exit` raises Exited instead (and logging stays up)."""
    def exit_(status: int) -> None:
        raise Exited(status)

    monkeypatch.setattr(os, "_exit", exit_)  # what the loop calls, as os._exit
    monkeypatch.setattr(logging, "shutdown", lambda: None)


@pytest.mark.usefixtures("exits")
def test_a_hung_commit_ends_the_process(settings: Settings) -> None:
    """Shows a hung `commit_transaction` ends the process with HUNG_EXIT_STATUS rather
    than do the batch again: the commit may have reached the coordinator, and only a
    restart (the committed offsets, the changelogs) can tell."""
    release = threading.Event()
    try:
        with pytest.raises(Exited) as exited:
            _run(settings, {}, lambda r: False, hang={"commit": release})
    finally:
        release.set()
    assert exited.value.args == (HUNG_EXIT_STATUS,)


def test_an_instance_fenced_while_out_of_the_group_carries_on_when_it_is_back(
        settings: Settings) -> None:
    """Shows an instance that left the group for a while (a broker restart longer
    than its session) and was fenced meanwhile by the one that took its partitions
    over carries on at its next assignment, on a new producer, instead of failing
    its first commit fatally (chaos seed 610: the processor exited with status 1)."""
    def out_fenced_and_back(loop: TableLoop, role: CopyRole, transactional_id: str) -> None:
        loop.consumer.unsubscribe()  # out of the group: its partitions revoked
        _fence(settings, transactional_id)
        role.calls.append("fenced")
        loop.consumer.subscribe([loop.topic], on_assign=loop._on_assign,
                                on_revoke=loop._on_revoke, on_lost=loop._on_revoke)
        _send(settings, loop.topic, [b"d", b"e"])

    calls, role, _, out = _run(settings, {}, lambda r: len(r.table) >= 5, then=out_fenced_and_back)
    back = calls.index("fenced")
    assert calls[back + 1:back + 3] == ["init", "assigned [0]"]
    assert role.table == [b"a", b"b", b"c", b"d", b"e"]
    assert _read_committed(settings, out) == [b"copy:a", b"copy:b", b"copy:c", b"copy:d", b"copy:e"]
    assert _committed_offset(settings, f"{settings.topic_prefix}loop-in") == 5


@pytest.mark.usefixtures("exits")
def test_calls_left_behind_are_capped_in_all(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shows the process exits once MAX_LEFT_BEHIND calls were left behind in all (here
    1): each keeps a blocked thread and a producer, and only a restart frees them."""
    monkeypatch.setattr("streams.kafka.loop.MAX_LEFT_BEHIND", 1)
    release = threading.Event()
    try:
        with pytest.raises(Exited) as exited:
            _run(settings, {}, lambda r: False, hang={"send_offsets": release})
    finally:
        release.set()
    assert exited.value.args == (HUNG_EXIT_STATUS,)


def test_the_watchdog_leaves_a_hung_call_behind_and_runs_the_next_on_a_new_thread() -> None:
    """Shows a call past its limit raises CallHung while it still runs, and the next
    call runs on a new thread; results and exceptions of calls that return come back."""
    release, entered = threading.Event(), threading.Event()

    def block() -> None:
        entered.set()
        release.wait()

    # Overdue counts as hung only while `block` is blocked, as if the broker were down
    # otherwise: a slow scheduler makes a call late, never hung.
    watchdog = Watchdog(0.1, entered.is_set, grace_s=0.0, poll_s=0.02)
    try:
        with pytest.raises(CallHung, match="a call"):
            watchdog.call("a call", block)
        assert not release.is_set()
        entered.clear()
        assert watchdog.call("the next", lambda x: x * 2, 21) == 42
        with pytest.raises(ValueError, match="boom"):
            watchdog.call("a failing one", int, "boom")
        assert watchdog.left_behind == 1
    finally:
        release.set()


def test_the_watchdog_waits_while_the_broker_is_down() -> None:
    """A call overdue while the broker is down goes on when it is back (librdkafka
    #5456): the watchdog asks its probe and waits; once the broker answers for its
    grace time and the call still hangs, it is left behind."""
    answers: list[bool] = []
    broker_up = threading.Event()

    def probe() -> bool:
        answers.append(broker_up.is_set())
        if answers.count(False) >= 3:  # overdue, asked three times while the broker is down
            broker_up.set()
        return answers[-1]

    release = threading.Event()
    try:
        with pytest.raises(CallHung):
            Watchdog(0.05, probe, grace_s=0.1, poll_s=0.02).call("a call", release.wait)
    finally:
        release.set()
    assert answers[:3] == [False] * 3 and answers[-1] is True


def test_a_call_overdue_while_the_broker_is_down_returns_once_it_is_back() -> None:
    """Shows an overdue call that returns after the broker came back is not left behind."""
    release = threading.Event()

    def probe() -> bool:
        release.set()  # the broker is back, and the call goes on
        return False

    watchdog = Watchdog(0.05, probe, grace_s=0.1, poll_s=0.02)
    assert watchdog.call("a call", lambda: release.wait() and "done") == "done"
    assert watchdog.left_behind == 0
