"""The transactional table loop: consume -> process -> produce -> commit, exactly once.

One loop for every role that turns input records into output records and table
state (the thread processor, the connector relay). The role says what to do with
the records (`TableRole`); the loop owns the order of things, which is what makes
the whole exactly once (KIP-447):

On assignment:
  -1. with a `producer_factory`: a new producer, whose `init_transactions` comes
     after any fence a takeover could still make. The loop calls
     `init_transactions` at start too, to abort at once what this instance's
     crashed self left open: another member's assignment may be waiting for that
     transaction (step 1), and this instance's own assignment waits for that member
     to finish its own. But an instance restarting as itself may be fenced after
     that call by the one that took its partitions over while it was away (step 0
     there), and its first commit would fail fatally. So may an instance that stayed
     up but dropped out of the group for a while (a broker restart outlasting its
     session: chaos seed 610 saw it exit so). That takeover runs inside the other
     instance's assignment, and this instance's next assignment comes only after the
     other has finished it, so the `init_transactions` of this step always comes
     last. It costs a round trip or two per rebalance;
  0. with a `Takeover`: fence the previous writers of the new partitions that are
     gone from the group, so that their open transactions are aborted now, not when
     the coordinator times them out (`streams.kafka.takeover`);
  1. read the new partitions' committed offsets: a read_committed consumer waits
     here for a deposed owner's pending transactional offsets, so the changelogs
     read next hold everything that owner committed;
  2. `role.assigned(partitions)`: the role restores its tables from their changelogs;
  3. assign the partitions at the committed offsets; with a `Takeover`, the next
     step commits a transaction even if it has nothing to write, with the new
     partitions' offsets: from then on their last committed writer is this instance.
On revocation or loss: `role.revoked(partitions)`: the role drops those tables.

Each step (`step`):
  1. consume a batch (read_committed); records of partitions not owned are dropped,
     and so are those read before a rebalance that ran inside the consume (a
     partition revoked and assigned again is read again from its committed offset).
     A batch whose decisions nobody waits for (the role's `unawaited`: a worker's
     reports) waits up to `linger_s` for more, so that the record somebody waits for
     next shares its transaction instead of queueing behind it;
  2. `role.process(records)`: the role stages its table writes (nothing reaches its
     stores yet) and returns the records to write, in order;
  3. begin the transaction and produce those records;
  4. `send_offsets_to_transaction`: the offsets of the partitions read, and of the
     partitions written but not read (their committed offsets, unchanged: a step may
     only write, and must still prove that this instance owns the partition), with
     the consumer's group metadata, so a deposed instance (stale generation) is refused,
     and this instance's transactional id as their commit metadata (for step 0);
  5. commit the transaction.
Each transactional call that fails with a retriable error (a timeout while the
broker restarts) is called again, for up to `TXN_RETRY_S`: the process stays up,
warm, and carries on the moment the broker is back, instead of exiting into a
cold start (seconds of imports and a restore on a loaded machine).
  6. `role.committed()`: only now does the role move its staged writes into its
     stores and act on what the transaction recorded.
A step with nothing read, nothing to write and no partition to claim has no transaction. If 3-5 fail with
an error that requires an abort: abort the transaction, seek each partition of the
batch back to its first record, then `role.aborted(error)`: the role drops what it
staged, and may ask for a pause during which batches are consumed and rewound,
not processed. Any other Kafka error is fatal: it propagates, the process exits,
and a restart recovers from Kafka.

After a call failed that way, a new producer (with a `producer_factory`; the same
transactional id) is made at once, and its `init_transactions` fences the old one and
aborts its transaction, which is therefore not aborted on the old one. At once, not
at the next transaction: the partitions may be revoked before that, and a transaction
left open past the revocation hides what the new owner then commits from every
read_committed reader, its own next restore included (chaos seed 3105):
librdkafka can keep a dead broker as the group coordinator after a broker restart and
wait on it forever in `send_offsets_to_transaction` (#5511, #5456), seen on the first
transaction after every broker restart of `bench.broker_restart`.

Every transactional call runs under a watchdog (`streams.kafka.watchdog`), on a
thread of its own: one that hangs far past its own timeout (#5456) is left behind
with its producer, the step aborts as above without calling that producer again, and
a new producer is made at once, whose `init_transactions` fences the hung one and
aborts its transaction. The process stays up: a restart would cost a
cold start and a rejoin. A hung `commit_transaction` is different: the commit may
have reached the coordinator, so the batch may not be done again; the process exits
with `HUNG_EXIT_STATUS` and a restart recovers from what Kafka committed. So it does
without a `producer_factory`, when `MAX_HUNG_CALLS` in a row hang, and once
`MAX_LEFT_BEHIND` are left behind in all (each keeps a thread and a producer).

Without a transactional producer (at_least_once, benchmarks only), 3-5 become:
produce, flush, commit the offsets; a crash between flush and commit repeats the batch.
The chaos program's controls crash there on purpose: a fault point
(`streams.kafka.faults`, off unless armed) ends the process after 3-4 (flushed),
before 5.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from streams.kafka.faults import commit_fault
from streams.kafka.takeover import Takeover
from streams.kafka.watchdog import HUNG_EXIT_STATUS, CallHung, Watchdog

__all__ = ["BATCH", "TXN_TIMEOUT_S", "Output", "TableLoop", "TableRole", "is_fatal",
           "record_position"]

log = logging.getLogger("threadline.kafka.loop")

BATCH = 500  # records per step at most
# Of each transactional call (a retriable timeout is called again, TXN_RETRY_S):
# short, because only a call that overruns it can be told from a hung one.
TXN_TIMEOUT_S = 5
# A call this long ignored its own timeout, which librdkafka otherwise keeps: it hangs
# (#5456: a coordinator request waits for a broker state change that may never come;
# seen after broker restarts of chaos runs). It is left behind with its producer
# (with a `reachable` probe, not while the brokers are down: see the watchdog).
TXN_HANG_S = TXN_TIMEOUT_S + 2
# Hung calls in a row (no commit between them) after which the process exits: new
# producers did not help, a restart may.
MAX_HUNG_CALLS = 3
# Hung calls in all after which the process exits: each keeps a blocked thread and a
# producer (librdkafka's threads and buffers) for good; a restart frees them.
MAX_LEFT_BEHIND = 8
TXN_RETRY_S = 120  # retriable errors of one call, for this long at most
# A transaction slower than this is logged with where its time went: on a quiet
# machine one takes 5-30 ms, and each one holds up every command behind it.
SLOW_TRANSACTION_S = 0.5

Delivered = Callable[[KafkaError | None, Message], None]


@dataclass(frozen=True, slots=True)
class Output:
    """One record a step writes, in the step's transaction."""

    topic: str
    key: bytes
    value: bytes | None  # None: a tombstone
    partition: int
    on_delivery: Delivered | None = None
    headers: list[tuple[str, str | bytes | None]] | None = None  # e.g. its decision's `traceparent`


class TableRole(Protocol):
    """What a role supplies to the table loop: its tables and what a batch does."""

    def assigned(self, partitions: list[int]) -> None:
        """Restore the tables of newly assigned partitions (before they are consumed)."""

    def revoked(self, partitions: list[int]) -> None:
        """Drop the tables of partitions this instance no longer owns."""

    def process(self, records: list[Message]) -> list[Output]:
        """Stage the table writes of `records` (maybe none) and return what to produce."""
        ...

    def committed(self) -> None:
        """The step's transaction committed: apply what `process` staged."""

    def aborted(self, error: KafkaError) -> float:
        """The step's transaction aborted: drop what `process` staged; the seconds
        to pause (consume and rewind without processing), 0 for none."""
        ...

    def after_step(self) -> None:
        """Between steps: timers and other clients of the role."""


def record_position(msg: Message) -> tuple[str, int, int]:
    """Topic, partition and offset of a consumed record (never None there)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


class TransactionPhases(NamedTuple):
    """Where a transaction's time went, in seconds (what a slow one is logged with)."""

    begin_and_produce: float
    send_offsets: float
    commit: float


class TableLoop:
    """The consume -> process -> produce -> commit loop of one role over one input topic."""

    def __init__(self, role: TableRole, consumer: Consumer, producer: Producer, topic: str, *,
                 transactional: bool = True, takeover: Takeover | None = None,
                 reachable: Callable[[], bool] | None = None,
                 producer_factory: Callable[[], Producer] | None = None,
                 unawaited: Callable[[Message], bool] | None = None,
                 linger_s: float = 0.0) -> None:
        self.role = role
        # A batch of records whose decisions nobody waits for (`unawaited`) waits up to
        # `linger_s` for more, or for one somebody waits for, to share its transaction.
        self.unawaited, self.linger_s = unawaited, linger_s
        self.producer_factory = producer_factory
        self._stale = False  # a transactional call timed out: a new producer next time
        self._hung = 0  # calls hung since the last commit: each left its producer behind
        self._abandoned = False  # the producer hung or is to be replaced: never call it again
        self.takeover = takeover
        self._metadata = takeover.me.metadata() if takeover is not None else None
        self.consumer = consumer
        self.producer = producer
        self.topic = topic
        self.transactional = transactional
        # `reachable`: whether the brokers accept connections (a call overdue while
        # they are down goes on when they are back; streams.kafka.watchdog)
        self.watchdog = Watchdog(TXN_HANG_S, reachable)
        self._positions: dict[int, int] = {}  # owned partition -> committed input offset (<0: none)
        self._rebalances = 0  # assignments and revocations so far (`next_batch` reads it)
        self._unclaimed: set[int] = set()  # assigned, not yet committed by this instance
        self._paused_until = 0.0
        # Seconds a transaction took: in all, then begin and produce, send offsets, commit.
        self.on_commit: Callable[[float, TransactionPhases], None] | None = None
        self._phases = TransactionPhases(0.0, 0.0, 0.0)
        self.fault = commit_fault()  # None unless the chaos program armed it (streams.kafka.faults)

    # --- lifecycle ------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Join the group and step until `should_stop()`; the caller closes."""
        if self.transactional:
            self._call("init_transactions", self.producer.init_transactions, TXN_TIMEOUT_S)
        self.consumer.subscribe([self.topic], on_assign=self._on_assign,
                                on_revoke=self._on_revoke, on_lost=self._on_revoke)
        while not should_stop():
            batch = self.next_batch()
            if time.monotonic() < self._paused_until:
                self._rewind(_starts(batch))
                continue
            self.step(batch)
            self.role.after_step()

    def next_batch(self) -> list[Message]:
        """What the consumer holds, up to BATCH records, at once; else the first record
        within 50 ms and whatever came with it. `consume(n, timeout)` alone waits for
        n records or the whole timeout: at a low rate every record waited for it."""
        batch: list[Message] = self._consume(BATCH, [], timeout=0)
        if not batch:
            batch = self._consume(1, [], timeout=0.05)
            if batch:
                batch = self._consume(BATCH - 1, batch, timeout=0)
        if batch and self.unawaited is not None and self.linger_s > 0:
            batch = self._linger(batch)
        return batch

    def _consume(self, most: int, batch: list[Message], timeout: float) -> list[Message]:
        """`batch` and up to `most` more records. The consumer runs the rebalance
        callbacks inside `consume`: after one, the records consumed before it are
        dropped, since a partition revoked and assigned again is read again from its
        committed offset (kept, they would be decided twice)."""
        rebalances = self._rebalances
        more: list[Message] = self.consumer.consume(most, timeout=timeout)
        return more if self._rebalances != rebalances else batch + more

    def _linger(self, batch: list[Message]) -> list[Message]:
        """`batch`, and while every record of it is one whose decision nobody waits for
        (a worker's start, step or heartbeat report: the worker goes on when the broker
        acks it), what arrives within `linger_s` of now: a run's completion, which
        arrives right after its last steps, then shares their transaction instead of
        waiting behind it (a transaction is 5-20 ms here, and the processor commits one
        at a time). A record somebody waits for ends the wait at once."""
        assert self.unawaited is not None
        if not all(self.unawaited(m) for m in batch):
            return batch
        deadline = time.monotonic() + self.linger_s
        while len(batch) < BATCH and (left := deadline - time.monotonic()) > 0:
            before, rebalances = len(batch), self._rebalances
            batch = self._consume(1, batch, timeout=left)
            if len(batch) == before and self._rebalances == rebalances:
                break  # nothing came
            batch = self._consume(BATCH - len(batch), batch, timeout=0)
            # Only what came is looked at (all of it after a rebalance replaced the batch).
            came = batch if self._rebalances != rebalances else batch[before:]
            if not all(self.unawaited(m) for m in came):
                break
        return batch

    def close(self) -> None:
        """Leave the group (revoking every partition)."""
        try:
            self.consumer.close()
        except Exception:
            log.exception("closing the consumer")

    # --- rebalance --------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalances += 1
        if self.transactional and self.producer_factory is not None:  # step -1: the module doc
            self._replace_producer("at an assignment, after any takeover's fence", logging.INFO)
        if self.takeover is not None:  # step 0: see the module doc
            self.takeover.fence_deposed(self.topic, [tp.partition for tp in partitions])
        committed = consumer.committed(partitions, timeout=60)  # step 1: see the module doc
        self.role.assigned([tp.partition for tp in partitions])
        for tp in committed:
            self._positions[tp.partition] = tp.offset
            if self.takeover is not None:
                self._unclaimed.add(tp.partition)
        consumer.assign(committed)
        self._paused_until = 0.0
        log.info("assigned %s", sorted(tp.partition for tp in partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._rebalances += 1
        self.role.revoked([tp.partition for tp in partitions])
        for tp in partitions:
            self._positions.pop(tp.partition, None)
            self._unclaimed.discard(tp.partition)
        log.info("revoked %s", sorted(tp.partition for tp in partitions))

    @property
    def positions(self) -> dict[int, int]:
        """Each owned partition's committed input offset (<0: none yet)."""
        return self._positions

    def _position(self, partition: int) -> int:
        """The committed input offset of an owned partition; its start if none is."""
        if self._positions[partition] < 0:
            low, _ = self.consumer.get_watermark_offsets(TopicPartition(self.topic, partition), 30)
            self._positions[partition] = int(low)
        return self._positions[partition]

    # --- one step: one transaction ----------------------------------------------------

    def step(self, batch: list[Message]) -> None:
        """Process `batch` and commit what it wrote with its offsets, or abort and rewind."""
        records = []
        for msg in batch:
            error = msg.error()
            if error is not None:
                if is_fatal(error):  # e.g. a static member fenced: only a restart recovers
                    raise KafkaException(error)
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", error)
                continue
            if msg.partition() in self._positions:
                records.append(msg)
        read = {record_position(m)[1]: record_position(m)[2] + 1 for m in records}
        outputs = self.role.process(records)
        if not outputs and not read and not self._unclaimed:
            return
        written = {o.partition for o in outputs if o.partition in self._positions} \
            | self._unclaimed
        positions = {**{p: self._position(p) for p in written}, **read}
        offsets = [TopicPartition(self.topic, p, o) if self._metadata is None
                   else TopicPartition(self.topic, p, o, self._metadata)
                   for p, o in sorted(positions.items())]
        started = time.perf_counter()
        try:
            self.commit(outputs, offsets)
        except KafkaException as exc:
            self._recover(exc, _starts(records))
            return
        took = time.perf_counter() - started
        if self.on_commit is not None:
            self.on_commit(took, self._phases)
        if took > SLOW_TRANSACTION_S:
            log.warning("a transaction took %.0f ms: begin and produce %.0f, send offsets %.0f, "
                        "commit %.0f (%d records written, %d offsets)", took * 1000,
                        *(phase * 1000 for phase in self._phases), len(outputs), len(offsets))
        self._hung = 0
        self._positions.update(read)
        self._unclaimed -= set(positions)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("committed %d records up to %s", len(records), sorted(read.items()))
        self.role.committed()

    def commit(self, outputs: list[Output], offsets: list[TopicPartition]) -> None:
        """Write `outputs` and commit them with the input `offsets` as one transaction
        (steps 3-5); raises KafkaException if that fails, having aborted nothing."""
        if self.transactional:
            if self._stale and self.producer_factory is not None:
                self._replace_producer()
            began = time.perf_counter()
            self._call("begin_transaction", self.producer.begin_transaction)
            self._produce(outputs)
            produced = time.perf_counter()
            if offsets:
                # Not called again on this producer: see _call's `fresh`.
                self._call("send_offsets_to_transaction",
                           self.producer.send_offsets_to_transaction, offsets,
                           self.consumer.consumer_group_metadata(), TXN_TIMEOUT_S, fresh=True)
            if self.fault is not None:
                self.fault(outputs, self.producer)
            sent = time.perf_counter()
            self._call("commit_transaction", self.producer.commit_transaction, TXN_TIMEOUT_S)
            self._phases = TransactionPhases(produced - began, sent - produced,
                                             time.perf_counter() - sent)
        else:  # at least once: a crash between flush and commit repeats the batch
            began = time.perf_counter()
            self._produce(outputs)
            if self.producer.flush(TXN_TIMEOUT_S):
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "flush timed out"))
            if self.fault is not None:
                self.fault(outputs, self.producer)
            flushed = time.perf_counter()
            if offsets:
                self.consumer.commit(offsets=offsets, asynchronous=False)
            # Not a transaction: the flush is its produce, the offset commit its "send offsets".
            self._phases = TransactionPhases(flushed - began, time.perf_counter() - flushed, 0.0)

    def _replace_producer(self, why: str = "after a timed-out call (librdkafka #5511)",
                          level: int = logging.WARNING) -> None:
        """A new transactional producer with the same id, fresh caches (see the module doc)."""
        assert self.producer_factory is not None
        log.log(level, "a new transactional producer %s", why)
        if not self._abandoned:  # a producer left behind is blocked in a call: leave it be
            self.producer.flush(0)
        self.producer = self.producer_factory()
        self._stale = self._abandoned = False
        self._call("init_transactions", self.producer.init_transactions, TXN_TIMEOUT_S)

    def _produce(self, outputs: list[Output]) -> None:
        for out in outputs:
            if out.headers is None:
                self.producer.produce(out.topic, out.value, out.key, partition=out.partition,
                                      on_delivery=out.on_delivery)
            else:
                self.producer.produce(out.topic, out.value, out.key, partition=out.partition,
                                      on_delivery=out.on_delivery, headers=out.headers)

    def _call(self, what: str, call: Callable[..., None], *args: Any, fresh: bool = False) -> None:
        """A transactional call under the watchdog, called again while it fails with a
        retriable error (for `TXN_RETRY_S` at most). `fresh` (with a producer factory):
        instead, abort the transaction, so that the batch is done again on a new
        producer: `send_offsets_to_transaction` called again on this one found the
        dead coordinator and hung (librdkafka #5511)."""
        deadline = time.monotonic() + TXN_RETRY_S
        while True:
            try:
                self.watchdog.call(what, call, *args)
                return
            except CallHung:
                self._left_behind(what)
                raise KafkaException(KafkaError(
                    KafkaError._TIMED_OUT, f"{what} hung past its timeout; its producer is left "
                    "behind", txn_requires_abort=True)) from None
            except KafkaException as exc:
                error = exc.args[0]
                if not (isinstance(error, KafkaError) and error.retriable()) \
                        or time.monotonic() > deadline:
                    raise
                self._stale = True
                if fresh and self.producer_factory is not None:
                    # Not aborted on this producer either: after a broker restart its
                    # abort_transaction failed fatally (INVALID_TXN_STATE, chaos seed 612),
                    # and the new producer's init_transactions aborts the transaction.
                    self._abandoned = True
                    raise KafkaException(KafkaError(error.code(), str(error),
                                                    txn_requires_abort=True)) from exc
                log.warning("%s: %s; calling it again", what, error)

    def _left_behind(self, what: str) -> None:
        """A call on the producer hung: the next transaction starts on a new one. The
        process exits instead when it hung in `commit_transaction` (the commit may have
        reached the coordinator: only a restart, reading the committed offsets and the
        changelogs, knows), without a way to make a new producer, or after too many in
        a row or in all."""
        self._hung += 1
        self._abandoned = self._stale = True
        if what == "commit_transaction" or self.producer_factory is None \
                or self._hung >= MAX_HUNG_CALLS or self.watchdog.left_behind >= MAX_LEFT_BEHIND:
            log.critical("%s hung past its timeout (%d in a row); exiting so a restart recovers",
                         what, self._hung)
            logging.shutdown()
            os._exit(HUNG_EXIT_STATUS)

    def _recover(self, exc: KafkaException, starts: dict[int, int]) -> None:
        err = exc.args[0]
        if not (self.transactional and isinstance(err, KafkaError) and err.txn_requires_abort()):
            raise exc  # fatal (e.g. a newer instance with our transactional id): exit
        if self._abandoned:  # hung, or to be replaced: the new producer's init_transactions aborts it
            log.warning("transaction left to be aborted by a new producer: %s", err)
            # Now, not at the next commit: a rebalance may take the partitions before
            # that, and their new owner restores and reads while the transaction is
            # open (chaos seed 3105). A live member hands its partitions over with no
            # transaction open; only a fence of a member gone aborts one for it.
            try:
                self._replace_producer("to abort the transaction the failed call left open")
            except KafkaException as again:
                if not again.args[0].txn_requires_abort():
                    raise
                # Its init_transactions hung in turn: the next transaction tries again
                # (MAX_HUNG_CALLS bounds how often).
                log.warning("no new producer yet: %s", again.args[0])
        else:
            log.warning("aborting transaction: %s", err)
            self._call("abort_transaction", self.producer.abort_transaction, TXN_TIMEOUT_S)
        # Back to the batch's first records: the committed offsets would miss a
        # partition that never committed (no offset to seek to).
        self._rewind(starts)
        pause = self.role.aborted(err)
        if pause > 0:
            self._paused_until = time.monotonic() + pause

    def _rewind(self, starts: dict[int, int]) -> None:
        """Consume again from `starts` (partition -> offset)."""
        for partition, offset in starts.items():
            try:
                self.consumer.seek(TopicPartition(self.topic, partition, offset))
            except KafkaException as exc:
                if partition in self._positions:
                    raise
                log.info("seek on partition %d: %s", partition, exc)  # no longer assigned


def is_fatal(error: KafkaError) -> bool:
    """Whether a consumed error ends the consumer. librdkafka hands a fatal consumer
    error (FENCED_INSTANCE_ID: a static member fenced, which a member whose rejoin
    timed out on a loaded host can be by its own new member id) to the application as
    a message whose code is `_FATAL` but whose `fatal()` flag is not set; reading only
    the flag, the processor logged it as a warning and consumed nothing ever after."""
    return bool(error.fatal() or error.code() == KafkaError._FATAL)


def _starts(batch: list[Message]) -> dict[int, int]:
    """Each partition's first offset in `batch` (errors left out)."""
    starts: dict[int, int] = {}
    for msg in batch:
        if msg.error() is None:
            _, partition, offset = record_position(msg)
            starts.setdefault(partition, offset)
    return starts
