"""The outbound relay: run events in, outbox entries and calls out, each call once.

The relay is the consumer group `{prefix}connector` over the events topic
(`read_committed`, static membership, so a restarted instance takes its
partitions back at once). It owns a thread's outbox when it owns the thread's
events partition; the outbox topic is co-partitioned and compacted, so on
assignment the relay reads each owned outbox partition to its end.

Each step is one Kafka transaction of the table loop (`streams.kafka.loop`; KIP-447:
`send_offsets_to_transaction` with the group metadata) holding, with the consumed offsets:

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

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from streams.clock import now_ms
from streams.config import Settings
from streams.connectors.audit import AuditKind, ConnectorAudit
from streams.connectors.calls import Done, Found, Outcome
from streams.connectors.config import ConnectorConfig
from streams.connectors.delivery import Calls, Job
from streams.connectors.outbox import ChatOutbox, OutboxKind, Sinks, plan
from streams.connectors.stats import ConnectorStats
from streams.connectors.topics import audit_topic, outbox_topic
from streams.kafka.clients import librdkafka_config, table_consumer_config, table_producer_config
from streams.kafka.loop import Output, TableLoop, record_position
from streams.kafka.restore import ChangelogReader
from streams.observability.tracing import header_of
from streams.wire import Codec, DecodeError
from streams.wire.connector import decode_outbox, encode_audit, encode_outbox

__all__ = ["Relay"]

log = logging.getLogger("threadline.connector.relay")

# The broker's answers to an offset commit from a stale member: this instance was deposed.
_DEPOSED = frozenset({KafkaError.FENCED_INSTANCE_ID, KafkaError.ILLEGAL_GENERATION,
                      KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS})
Key = tuple[int, bytes]  # partition, thread key


class Relay:
    """The outbound relay role: plans outbox entries and makes their calls, on the table loop."""

    def __init__(self, settings: Settings, config: ConnectorConfig, stats: ConnectorStats,
                 instance_id: str, calls: Calls, codec: Codec | None = None) -> None:
        self.settings, self.config, self.stats, self.calls = settings, config, stats, calls
        # THREADLINE_SCHEMA_REGISTRY_URL: the Confluent format; else single-object.
        self.codec = codec or Codec.from_settings(settings)
        self.instance_id = instance_id
        self.events, self.outbox = settings.topics.events, outbox_topic(settings)
        self.audit = audit_topic(settings)
        self.group_id = settings.group_id("connector")
        self.sinks = Sinks(chat=config.chat_enabled, webhook=config.webhook_enabled)
        self.tables: dict[int, dict[bytes, ChatOutbox]] = {}  # committed outboxes, owned partitions
        self.active: set[Key] = set()  # threads with entries not done
        self.unrecorded: list[tuple[Job, Outcome]] = []
        self.draining = False
        self._staged: dict[Key, ChatOutbox] = {}  # the step in progress: its outboxes
        self._fenced: list[Job] = []  # and the calls it fences
        self._traces: dict[Key, str] = {}  # the step's threads: their newest event's traceparent
        client_id = f"connector-{instance_id}"
        self.loop = TableLoop(
            self, Consumer(table_consumer_config(settings, self.group_id, client_id,
                                                 offset_reset=config.offset_reset,
                                                 group_instance_id=instance_id)),
            Producer(table_producer_config(settings, client_id, linger_ms=1,
                                           transactional_id=f"{self.group_id}-{instance_id}",
                                           # no takeover fences a connector lost for good
                                           transaction_timeout_ms=10_000)),
            self.events)
        # Records of things already done: not transactional (a fenced transaction
        # must not erase the evidence of a real call), never awaited.
        self.auditor = Producer(librdkafka_config(settings, **{
            "log_level": 3, "client.id": client_id, "acks": "all", "enable.idempotence": True,
            "partitioner": "murmur2_random", "linger.ms": 5}))

    # --- lifecycle ----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Relay until `stop` is set, then drain the calls in flight; closes at the end."""
        self.codec.register_schemas()  # a no-op without a registry
        log.info("relay %s started (chat %s, webhook %s)", self.instance_id,
                 self.sinks.chat, self.sinks.webhook)
        try:
            self.loop.run(stop.is_set)
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
            self.loop.step([])
        except KafkaException as exc:
            log.warning("results not recorded at shutdown: %s", exc)

    def close(self) -> None:
        """Stop the calls, leave the group, flush the audit records."""
        self.calls.close()
        self.loop.close()
        self.auditor.flush(5)

    # --- the table loop's calls (streams.kafka.loop.TableRole) ------------------------------

    def assigned(self, partitions: list[int]) -> None:
        """Restore the partitions' outboxes and the calls they left in flight."""
        restored = self._restore(partitions)
        for partition in partitions:
            table = restored.get(partition, {})
            self.tables[partition] = table
            for key, outbox in table.items():
                self.calls.restored(outbox)
                if any(not e.status.done for e in outbox.entries):
                    self.active.add((partition, key))
        log.info("%d threads with entries to deliver", len(self.active))

    def revoked(self, partitions: list[int]) -> None:
        """Forget the partitions' outboxes."""
        for partition in partitions:
            for outbox in self.tables.pop(partition, {}).values():
                self.calls.forget(outbox)
        self.active = {k for k in self.active if k[0] in self.tables}

    def process(self, records: list[Message]) -> list[Output]:
        """Plan the events' entries, record finished calls, fence the next calls: the
        outboxes that changed, to write."""
        self._traces = {}
        staged = self._step(records)
        # Each outbox record carries its event's trace context as a `traceparent` header.
        return [Output(self.outbox, key, encode_outbox(outbox), partition,
                       headers=header_of(self._traces.get((partition, key))))
                for (partition, key), outbox in staged.items()]

    def committed(self) -> None:
        """The outboxes are recorded: keep them, and make the fenced calls."""
        self.stats.add("transactions")
        self.unrecorded = []
        for (partition, key), outbox in self._staged.items():
            if partition not in self.tables:
                continue
            self.tables[partition][key] = outbox
            if any(not e.status.done for e in outbox.entries):
                self.active.add((partition, key))
            else:
                self.active.discard((partition, key))
        for job in self._fenced:
            self.calls.launch(job)

    def aborted(self, error: KafkaError) -> float:
        """Nothing recorded, no call made; a deposed instance pauses a second."""
        self.stats.add("aborted")
        if error.code() in _DEPOSED:
            self.stats.add("fenced")
            log.warning("fenced (%s): deposed, no calls until the next assignment", error.name())
            return 1.0
        return 0.2

    def after_step(self) -> None:
        """Serve the audit producer's delivery reports."""
        self.auditor.poll(0)

    def _restore(self, partitions: list[int]) -> dict[int, dict[bytes, ChatOutbox]]:
        """The newest committed outbox of every thread in `partitions`."""
        tables: dict[int, dict[bytes, ChatOutbox]] = {p: {} for p in partitions}

        def apply(msg: Message) -> None:
            try:
                tables[msg.partition() or 0][msg.key() or b""] = decode_outbox(msg.value() or b"")
            except DecodeError as exc:
                log.warning("skipping an unreadable outbox record: %s", exc)

        with ChangelogReader(self.settings, f"{self.group_id}-restore") as reader:
            marks = reader.all_watermarks(self.outbox, partitions)
            reader.read(self.outbox, {p: low for p, (low, _) in marks.items()}, apply,
                        ends={p: high for p, (_, high) in marks.items()})
        return tables

    # --- one step ------------------------------------------------------------------------

    def _outbox(self, staged: dict[Key, ChatOutbox], key: Key) -> ChatOutbox | None:
        return staged.get(key) or self.tables.get(key[0], {}).get(key[1])

    def _step(self, batch: list[Message]) -> dict[Key, ChatOutbox]:
        now = now_ms()
        staged: dict[Key, ChatOutbox] = {}
        self.calls.begin_step()
        for msg in batch:
            self._plan(msg, staged, now)
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
            updated = self.calls.record(current, job, outcome, now)
            if updated != current:
                staged[key] = updated
                self.unrecorded.append((job, outcome))  # until the transaction commits
        fenced: list[Job] = []
        for key in [] if self.draining else sorted(self.active | set(staged)):
            current = self._outbox(staged, key)
            if current is not None:
                updated = self.calls.choose(key[0], key[1], current, now, fenced.append)
                if updated != current:
                    staged[key] = updated
        self._staged, self._fenced = staged, fenced
        return staged

    def _plan(self, msg: Message, staged: dict[Key, ChatOutbox], now_ms: int) -> None:
        _, partition, offset = record_position(msg)
        key = msg.key() or b""
        try:
            meta, event = self.codec.decode_event(msg.value() or b"")
        except DecodeError as exc:
            log.warning("skipping event %d@%d: %s", partition, offset, exc)
            return
        current = self._outbox(staged, (partition, key))
        updated = plan(current, event, meta.tenant, self.sinks, now_ms)
        if updated is not None:
            if meta.traceparent:
                self._traces[(partition, key)] = meta.traceparent
            self.stats.add("entries_planned",
                           len(updated.entries) - (len(current.entries) if current else 0))
            staged[(partition, key)] = updated

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
                                self.instance_id, json.dumps(detail), now_ms())
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
