"""The outbound relay: run events in, outbox entries and calls out, each call once.

The relay is the consumer group `{prefix}connector` over the events topic
(`read_committed`, static membership, so a restarted instance takes its
partitions back at once). It owns a thread's outbox when it owns the thread's
events partition; the outbox topic is co-partitioned and compacted, so on
assignment the relay reads each owned outbox partition to its end.

Each step is one Kafka transaction (KIP-447: `send_offsets_to_transaction` with
the consumer's group metadata) holding, together with the consumed offsets:

1. the entries the consumed events cause (`outbox.plan`), as `pending`;
2. the results of calls that finished (`delivered`, `failed`), and adoptions;
3. the fence: the next entry of each idle lane marked `delivering`.

Only after that transaction commits are the fenced calls made. A deposed
instance (its generation is stale: it was paused past the session timeout, or
its partitions moved) has the transaction refused, so it neither records nor
calls; it waits for its next assignment. A call also has to start within the
lease after its fence began, and another owner reconciles a `delivering` post
only after that lease (plus a clock margin) has passed.

A result that cannot be recorded (the transaction aborts) stays in memory and
goes into the next transaction; if the thread has moved, it is dropped and
counted, and the new owner reconciles: the result is a record of something
done, which never blocks anything.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from streams.config import Settings
from streams.connectors.calls import Done, Found, Outcome
from streams.connectors.codec import AuditKind, ConnectorAudit, decode_outbox, encode_audit, encode_outbox
from streams.connectors.config import ConnectorConfig
from streams.connectors.delivery import Calls, Job
from streams.connectors.outbox import ChatOutbox, OutboxKind, Sinks, plan
from streams.connectors.stats import ConnectorStats
from streams.connectors.topics import audit_topic, outbox_topic
from streams.kafka.clients import librdkafka_config
from streams.serialization import Codec, DecodeError

__all__ = ["Relay"]

log = logging.getLogger("threadline.connector.relay")

# The broker's answers to an offset commit from a stale member: this instance was deposed.
_DEPOSED = frozenset({KafkaError.FENCED_INSTANCE_ID, KafkaError.ILLEGAL_GENERATION,
                      KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS})
Key = tuple[int, bytes]  # partition, thread key


def _now_ms() -> int:
    return int(time.time() * 1000)


class Relay:
    def __init__(self, settings: Settings, config: ConnectorConfig, stats: ConnectorStats,
                 instance_id: str, calls: Calls, codec: Codec | None = None) -> None:
        self.settings, self.config, self.stats, self.calls = settings, config, stats, calls
        # THREADLINE_SCHEMA_REGISTRY_URL: the Confluent format; else single-object.
        self.codec = codec or Codec.from_settings(settings)
        self.instance_id = instance_id
        self.events, self.outbox = settings.topics.events, outbox_topic(settings)
        self.audit = audit_topic(settings)
        self.group_id = f"{settings.topic_prefix}connector"
        self.sinks = Sinks(chat=config.chat_enabled, webhook=config.webhook_enabled)
        self.tables: dict[int, dict[bytes, ChatOutbox]] = {}  # committed outboxes, owned partitions
        self.positions: dict[int, int] = {}  # committed input offsets, owned partitions
        self.active: set[Key] = set()  # threads with entries not done
        self.unrecorded: list[tuple[Job, Outcome]] = []
        self.paused_until = 0.0
        self.draining = False
        common = librdkafka_config(settings, **{"log_level": 3, "client.id": f"connector-{instance_id}"})
        self.consumer = Consumer({
            **common, "group.id": self.group_id, "group.instance.id": instance_id,
            "enable.auto.commit": False, "auto.offset.reset": config.offset_reset,
            "isolation.level": "read_committed", "session.timeout.ms": settings.session_timeout_ms,
            "heartbeat.interval.ms": 1_000, "fetch.wait.max.ms": 20,
            "partition.assignment.strategy": "range",
        })
        self.producer = Producer({
            **common, "transactional.id": f"{self.group_id}-{instance_id}",
            "partitioner": "murmur2_random", "linger.ms": 1, "enable.idempotence": True,
            # A crashed instance's open transaction blocks readers until it times out,
            # unless the same instance restarts first.
            "transaction.timeout.ms": 10_000,
        })
        # Records of things already done: not transactional (a fenced transaction
        # must not erase the evidence of a real call), never awaited.
        self.auditor = Producer({**common, "acks": "all", "enable.idempotence": True,
                                 "partitioner": "murmur2_random", "linger.ms": 5})

    # --- lifecycle ----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        self.codec.register_schemas()  # a no-op without a registry
        self.producer.init_transactions(30)
        self.consumer.subscribe([self.events], on_assign=self._on_assign,
                                on_revoke=self._on_revoke, on_lost=self._on_revoke)
        log.info("relay %s started (chat %s, webhook %s)", self.instance_id,
                 self.sinks.chat, self.sinks.webhook)
        try:
            while not stop.is_set():
                batch = self.consumer.consume(500, timeout=0.05)
                if time.monotonic() < self.paused_until:
                    self._rewind(batch)
                    continue
                self._step(batch)
                self.auditor.poll(0)
            self._drain()
        finally:
            self.close()

    def _drain(self, timeout_s: float = 5.0) -> None:
        """On shutdown: let the calls in flight finish and record their results, so
        that the next owner has nothing to reconcile; start no new call."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self.calls.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            self._step([])
        except KafkaException as exc:
            log.warning("results not recorded at shutdown: %s", exc)

    def close(self) -> None:
        self.calls.close()
        try:
            self.consumer.close()
        except Exception:
            log.exception("closing the consumer")
        self.auditor.flush(5)

    # --- rebalance ------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Committed offsets first: a read_committed consumer waits here for a deposed
        # owner's pending transactional offsets (KIP-447), so the outbox read next
        # holds everything that owner committed.
        committed = consumer.committed(partitions, timeout=60)
        restored = self._restore([tp.partition for tp in partitions])
        for tp in committed:
            table = restored.get(tp.partition, {})
            self.tables[tp.partition] = table
            self.positions[tp.partition] = tp.offset if tp.offset >= 0 else self._low(tp.partition)
            for key, outbox in table.items():
                self.calls.restored(outbox)
                if any(not e.status.done for e in outbox.entries):
                    self.active.add((tp.partition, key))
        consumer.assign(committed)
        self.paused_until = 0.0
        log.info("assigned %s: %d threads with entries to deliver",
                 sorted(tp.partition for tp in partitions), len(self.active))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            for outbox in self.tables.pop(tp.partition, {}).values():
                self.calls.forget(outbox)
            self.positions.pop(tp.partition, None)
        self.active = {k for k in self.active if k[0] in self.tables}
        log.info("revoked %s", sorted(tp.partition for tp in partitions))

    def _low(self, partition: int) -> int:
        low, _ = self.consumer.get_watermark_offsets(TopicPartition(self.events, partition), 30)
        return int(low)

    def _restore(self, partitions: list[int]) -> dict[int, dict[bytes, ChatOutbox]]:
        """The newest committed outbox of every thread in `partitions`."""
        tables: dict[int, dict[bytes, ChatOutbox]] = {p: {} for p in partitions}
        reader = Consumer(librdkafka_config(self.settings, **{
            "log_level": 3, "group.id": f"{self.group_id}-restore", "enable.auto.commit": False,
            "isolation.level": "read_committed", "enable.partition.eof": True}))
        try:
            todo = set()
            for p in partitions:
                low, high = reader.get_watermark_offsets(TopicPartition(self.outbox, p), 30)
                if high > low:
                    todo.add(p)
            reader.assign([TopicPartition(self.outbox, p, OFFSET_BEGINNING) for p in sorted(todo)])
            while todo:
                for msg in reader.consume(500, timeout=1.0):
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            todo.discard(msg.partition() or 0)
                            continue
                        raise KafkaException(error)
                    try:
                        tables[msg.partition() or 0][msg.key() or b""] = decode_outbox(msg.value() or b"")
                    except DecodeError as exc:
                        log.warning("skipping an unreadable outbox record: %s", exc)
        finally:
            reader.close()
        return tables

    # --- one step: one transaction -------------------------------------------------------

    def _outbox(self, staged: dict[Key, ChatOutbox], key: Key) -> ChatOutbox | None:
        return staged.get(key) or self.tables.get(key[0], {}).get(key[1])

    def _step(self, batch: list[Message]) -> None:
        now_ms = _now_ms()
        staged: dict[Key, ChatOutbox] = {}
        read: dict[int, int] = {}
        self.calls.begin_step()
        for msg in batch:
            self._plan(msg, staged, read, now_ms)
        fresh = self.calls.finished()
        for job, outcome in fresh:
            self.calls.note(job, outcome)
            self._audit_outcome(job, outcome)
        results, self.unrecorded = self.unrecorded + fresh, []
        for job, outcome in results:
            key = (job.partition, job.key)
            current = self._outbox(staged, key)
            if current is None:
                self.stats.add("results_unrecorded")
                log.info("result for %s not recorded: the thread moved", job.entry.outbox_id)
                continue
            updated = self.calls.record(current, job, outcome, now_ms)
            if updated != current:
                staged[key] = updated
                self.unrecorded.append((job, outcome))  # until the transaction commits
        fenced: list[Job] = []
        for key in [] if self.draining else sorted(self.active | set(staged)):
            current = self._outbox(staged, key)
            if current is not None:
                updated = self.calls.choose(key[0], key[1], current, now_ms, fenced.append)
                if updated != current:
                    staged[key] = updated
        if staged or read:
            self._commit(staged, read, batch, fenced)

    def _plan(self, msg: Message, staged: dict[Key, ChatOutbox], read: dict[int, int],
              now_ms: int) -> None:
        error = msg.error()
        partition, offset = msg.partition(), msg.offset()
        if error is not None or partition is None or offset is None:
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                log.warning("consume error: %s", error)
            return
        if partition not in self.tables:
            return
        read[partition] = offset + 1
        key = msg.key() or b""
        try:
            meta, event = self.codec.decode_event(msg.value() or b"")
        except DecodeError as exc:
            log.warning("skipping event %d@%d: %s", partition, offset, exc)
            return
        current = self._outbox(staged, (partition, key))
        updated = plan(current, event, meta.tenant, self.sinks, now_ms)
        if updated is not None:
            self.stats.add("entries_planned",
                           len(updated.entries) - (len(current.entries) if current else 0))
            staged[(partition, key)] = updated

    def _commit(self, staged: dict[Key, ChatOutbox], read: dict[int, int], batch: list[Message],
                fenced: list[Job]) -> None:
        positions = {**{p: self.positions[p] for p, _ in staged if p in self.positions}, **read}
        offsets = [TopicPartition(self.events, p, o) for p, o in sorted(positions.items())]
        try:
            self.producer.begin_transaction()
            for (partition, key), outbox in staged.items():
                self.producer.produce(self.outbox, encode_outbox(outbox), key, partition=partition)
            self.producer.send_offsets_to_transaction(
                offsets, self.consumer.consumer_group_metadata(), 30)
            self._commit_transaction()
        except KafkaException as exc:
            self._recover(exc, batch)
            return
        self.stats.add("transactions")
        self.unrecorded = []
        self.positions.update(read)
        for (partition, key), outbox in staged.items():
            if partition not in self.tables:
                continue
            self.tables[partition][key] = outbox
            if any(not e.status.done for e in outbox.entries):
                self.active.add((partition, key))
            else:
                self.active.discard((partition, key))
        for job in fenced:
            self.calls.launch(job)

    def _commit_transaction(self) -> None:
        for attempt in range(3):
            try:
                self.producer.commit_transaction(30)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or attempt == 2:
                    raise

    def _recover(self, exc: KafkaException, batch: list[Message]) -> None:
        err = exc.args[0]
        if not (isinstance(err, KafkaError) and err.txn_requires_abort()):
            raise exc  # fatal (e.g. a newer instance with our transactional id): exit
        self.stats.add("aborted")
        self.producer.abort_transaction(30)
        if err.code() in _DEPOSED:
            self.stats.add("fenced")
            log.warning("fenced (%s): deposed, no calls until the next assignment", err.name())
            self.paused_until = time.monotonic() + 1.0
        else:
            log.warning("transaction aborted: %s", err)
            self.paused_until = time.monotonic() + 0.2
        self._rewind(batch)

    def _rewind(self, batch: list[Message]) -> None:
        """Consume `batch` again later: back to the committed positions."""
        for partition in {m.partition() for m in batch if m.error() is None}:
            if partition is not None and partition in self.positions:
                try:
                    self.consumer.seek(TopicPartition(self.events, partition,
                                                      self.positions[partition]))
                except KafkaException as exc:  # e.g. no longer assigned
                    log.info("seek on partition %d: %s", partition, exc)

    # --- audit: records of things done, never blocking -------------------------------------

    def _audit_outcome(self, job: Job, outcome: Outcome) -> None:
        if isinstance(outcome, Done):
            kind = AuditKind.WEBHOOK_CALL if job.entry.kind is OutboxKind.WEBHOOK_POST \
                else AuditKind.CHAT_CALL
            self.stats.add("calls")
        elif isinstance(outcome, Found):
            kind = AuditKind.ADOPTED
        else:
            return
        entry = job.entry
        detail = {"kind": entry.kind.value, "role": entry.role, "channel": entry.channel,
                  "result_ts": outcome.result_ts, "attempt": entry.attempts + (0 if job.reconcile else 1),
                  "coalesced": job.coalesced_id}
        record = ConnectorAudit(str(uuid.uuid4()), _thread_id(job.key), kind, entry.outbox_id,
                                self.instance_id, json.dumps(detail), _now_ms())
        try:
            self.auditor.produce(self.audit, encode_audit(record), job.key,
                                 on_delivery=self._audit_delivered)
        except Exception as exc:  # queue full or producer broken: count it, carry on
            self.stats.add("audit_failed")
            log.warning("audit record for %s not written: %s", entry.outbox_id, exc)

    def _audit_delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.stats.add("audit_failed")
            log.warning("audit record not written: %s", err)


def _thread_id(key: bytes) -> str:
    return key.decode("utf-8", "replace")
