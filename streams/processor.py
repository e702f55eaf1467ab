"""The thread processor: commands in, decisions out, exactly once.

A thin shell around `streams.core.thread`: for each command record it loads the
thread's state from the partition's RocksDB table, calls `decide`, folds the
events with `evolve`, and returns the events, the dispatches for workers and the
new state (changelog) as the records of the step; the Kafka runtime's table loop
(`streams.kafka.loop`) writes them in one Kafka transaction together with the
input offsets, and only then commits the tables (KIP-447: a deposed instance is
fenced by the group generation).

The state holds no messages: the partition's history table (`streams.message_store`)
tells the core what it needs beyond the state (`Known`: the run a message id already
started, the stored user message a regenerate or edit names, whether a regenerate's
key was answered), and each dispatch's context is the run's branch of the history,
the path above its message (`branches.run_context_seqs`, docs/branches.md).

Why not Faust's `exactly_once` mode: in faust-streaming 0.15.3 table changelog
writes go through `send_soon`, outside the transaction; commit failures are
logged and swallowed (`Producer.commit_transaction`); and table rows reach
RocksDB before the transaction commits, so a `kill -9` leaves state that no
committed event explains. See docs/exactly-once.md.

Deadlines (heartbeat, attempt, retry due) live in the thread state; a timer
turns due ones into `CheckDeadlines` commands on the commands topic, so the
clock goes through the same fenced, transactional path as every other input.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from confluent_kafka import Consumer, KafkaError, Message, Producer

from streams.clock import now_ms
from streams.config import Settings
from streams.core.branches import Linked, parent_seq_of, run_context_seqs
from streams.core.copies import MAX_PARTS, imported_writes
from streams.core.domain import (
    NOTHING_KNOWN,
    AttemptDispatched,
    CheckDeadlines,
    Command,
    CopyThread,
    EditMessage,
    Event,
    HistoryImported,
    ImportHistory,
    Known,
    MessageAccepted,
    PostUserMessage,
    RegenerateAnswer,
    ReportAttemptCompleted,
    ReportAttemptFailed,
    RunFailed,
    ThreadCopied,
    ThreadState,
    WorkerReport,
)
from streams.core.history import (
    HistoryErased,
    HistoryWrite,
    MessagePut,
    MessageRemoved,
    RunStatusChanged,
    context_window,
    history_writes,
    message_key,
    relinked,
)
from streams.core.ids import derived_envelope_id, regenerate_run_id_for
from streams.core.lifecycle import dispatch_record, lifecycle_record
from streams.core.reasons import FailureCode
from streams.core.records import DeadLetter, HistoryMessage, MessageRecord
from streams.core.thread import (
    decide,
    evolve,
    next_deadline_ms,
    output_bytes,
)
from streams.heap import freeze_startup_heap
from streams.kafka.clients import (
    brokers_reachable,
    librdkafka_config,
    table_consumer_config,
    table_producer_config,
    takeover_for,
)
from streams.kafka.loop import Output, TableLoop, record_position
from streams.kafka.restore import ChangelogReader, restore_tables
from streams.kafka.state_store import PartitionStore, TableStores
from streams.kafka.topics import ensure_topics, record_limit
from streams.message_store import ContextLink, ContextWindows, MessageStore
from streams.migration import migrate_partition
from streams.observability.processor import ProcessorObserver
from streams.observability.tracing import header_of, record_traceparent
from streams.thread_copies import import_commands, import_parts
from streams.wire import (
    REPLY_HEADER,
    Codec,
    DecodeError,
    EnvelopeMeta,
    header_value,
    payload_header,
    payload_named,
    stream_headers,
)

__all__ = ["Processor", "ProcessorStats", "run_processor"]

PARTITION_UA = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the producer's partitioner picks

log = logging.getLogger("threadline.processor")

HISTORY_LIMIT = 50  # earlier messages handed to the agent with a dispatch, at most
TICK_INTERVAL_S = 0.1
TICK_RESEND_MS = 2_000  # a due tick not yet acted on is sent again after this
DEAD_LETTER_MAX_BYTES = 256 * 1024  # of a dead record's key and value kept in its dead letter
# Commands whose decisions nobody waits for, by their payload header: a worker's
# reports of an attempt's start, of its steps and heartbeats (it goes on once the
# broker acks them; an execution whose dispatch was redelivered waits at its barrier
# for its `execution_started`, up to REPORT_LINGER_S longer). A batch of only these
# waits up to REPORT_LINGER_S for more (`TableLoop`): a run's start and steps then
# share one transaction, and its completion, which comes right after its last steps,
# shares theirs instead of queueing behind them (`python -m bench.run_hops`: the
# client had a run's end after 52 ms, against 87 when each batch went at once).
UNAWAITED = frozenset({b"ReportAttemptStarted", b"ReportExecutionStarted",
                       b"ReportStepCompleted", b"ReportHeartbeat"})
REPORT_LINGER_S = 0.02




def instance_id_for(settings: Settings) -> str:
    """Stable across restarts of the same instance (same data folder), so that a
    restarted instance's `init_transactions` aborts what its crashed self left open;
    unique per data folder's contents, so replicas never fence each other."""
    from streams.identity import instance_id  # here: the rest of this module is being rewritten

    return instance_id(settings)


@dataclass
class ProcessorStats:
    """Counters for metrics and benchmarks (monotonic clock seconds)."""

    commands: int = 0
    batches: int = 0
    aborts: int = 0
    first_batch_at: float | None = None
    last_batch_at: float | None = None


@dataclass
class _Partition:
    deadlines: dict[bytes, int] = field(default_factory=dict)  # thread key -> due ms
    ticks_sent: dict[bytes, int] = field(default_factory=dict)  # thread key -> sent at


@dataclass(frozen=True, slots=True)
class _Output:
    topic: str
    key: bytes
    value: bytes | None  # None: a tombstone
    # Kafka headers of its own: an event's or a stream record's PAYLOAD_HEADER (and a
    # lifecycle record's LIFECYCLE_HEADER), and the REPLY_HEADER of the command it was
    # decided from, when that had one.
    headers: tuple[tuple[str, bytes], ...] = ()
    # None: the command's own partition (every table, changelog and output topic is
    # partitioned alike); PARTITION_UA: the partitioner's, for another thread's command.
    partition: int | None = None


@dataclass
class _Decision:
    """What one command decided, encoded and checked, not yet produced."""

    state: ThreadState | None
    outputs: list[_Output]
    history: list[tuple[MessageRecord | None, int, bytes | None]]  # (record, seq, raw)
    deleted: bool
    too_large_output: bool = False  # the run ended output_too_large
    events: tuple[Event, ...] = ()


@dataclass
class _Step:
    """What the step in progress staged, until its transaction commits or aborts."""

    touched: dict[tuple[int, bytes], ThreadState | None] = field(default_factory=dict)
    deleted: set[tuple[int, bytes]] = field(default_factory=set)
    commands: int = 0


class Processor:
    """The command processor role: decides each command record, on the table loop."""

    def __init__(self, settings: Settings, instance_id: str | None = None,
                 codec: Codec | None = None) -> None:
        self.settings = settings
        # THREADLINE_SCHEMA_REGISTRY_URL: the Confluent format; else single-object.
        self.codec = codec or Codec.from_settings(settings)
        self.topics = settings.topics
        self.policy = settings.policy
        self.instance_id = instance_id or instance_id_for(settings)
        self.group_id = settings.group_id("processor")
        root = settings.data_dir / "processor" / self.instance_id
        self.stores = TableStores(root, "threads")
        self.history_stores = TableStores(root, "messages")
        self.partitions: dict[int, _Partition] = {}
        self.cache: dict[bytes, ThreadState | None] = {}
        self.windows = ContextWindows(HISTORY_LIMIT)  # cleared with `cache`
        self.stats = ProcessorStats()
        self.stopping = False
        self.max_record_bytes = 1_000_000  # until run() reads the topics' limit
        self.exactly_once = settings.processor.processing_guarantee == "exactly_once"
        client_id = f"processor-{self.instance_id}"

        def producer_factory() -> Producer:
            return Producer(table_producer_config(
                # No linger: the commit waits for the records it holds, and a transaction
                # is most of a decision's latency (back to back, 1-2 ms of 8-11,
                # `bench.txn_backoff`). A step produces its records in one burst, so they
                # still share produce requests.
                settings, client_id, linger_ms=0,
                transactional_id=f"{self.group_id}-{self.instance_id}" if self.exactly_once
                else None))

        self.loop = TableLoop(
            self, Consumer(table_consumer_config(settings, self.group_id, client_id,
                                                 group_instance_id=self.instance_id)),
            producer_factory(),
            self.topics.commands, transactional=self.exactly_once,
            takeover=takeover_for(settings, self.group_id, f"{self.group_id}-{self.instance_id}",
                                  self.instance_id) if self.exactly_once else None,
            reachable=brokers_reachable(settings),
            producer_factory=producer_factory if self.exactly_once else None,
            unawaited=_unawaited, linger_s=REPORT_LINGER_S)
        self._step = _Step()
        self._next_tick = 0.0
        self.observer = ProcessorObserver(self.topics.commands)
        self.loop.on_commit = self.observer.commit_took
        # Clock ticks go to the commands topic outside any transaction.
        self.ticker = Producer(librdkafka_config(settings, **{
            "log_level": 3, "partitioner": "murmur2_random", "linger.ms": 5,
            "enable.idempotence": True}))

    # --- lifecycle ----------------------------------------------------------

    def run(self) -> None:
        """Check the topics, then decide commands until `stopping`; closes at the end."""
        ensure_topics(self.settings)
        self.codec.register_schemas()  # a no-op without a registry
        self.max_record_bytes = min(record_limit(self.settings),
                                    self.settings.processor.max_record_bytes or 2**31)
        # An answer must fit in each record that carries it whole (the event, the
        # lifecycle mirror, the history record), envelope included.
        self.policy = replace(self.policy, max_output_bytes=min(
            self.policy.max_output_bytes, self.max_record_bytes - _ENVELOPE_ROOM))
        log.info("processor %s started on %s (records up to %d bytes)", self.instance_id,
                 self.settings.bootstrap, self.max_record_bytes)
        freeze_startup_heap()
        self._next_tick = time.monotonic()
        try:
            self.loop.run(lambda: self.stopping)
        finally:
            self.close()

    def close(self) -> None:
        """Leave the group, flush the ticks, close the tables."""
        self.loop.close()
        self.ticker.flush(5)
        self.stores.close_all()
        self.history_stores.close_all()

    # --- the table loop's calls (streams.kafka.loop.TableRole) --------------------

    def assigned(self, partitions: list[int]) -> None:
        """Restore the partitions' tables and their deadlines."""
        self.observer.rebalanced("assigned", len(partitions))
        started = time.monotonic()
        with ChangelogReader(self.settings, f"{self.group_id}-restore") as reader:
            stores = restore_tables(reader, self.stores, self.topics.threads, partitions,
                                    lambda s, key, value, offset: s.put(key, value, offset)
                                    if value is not None else s.delete(key, offset))
            histories = restore_tables(
                reader, self.history_stores, self.topics.messages, partitions,
                lambda s, key, value, offset: MessageStore(s, self.codec).restore(key, value, offset))
        for partition in partitions:
            self._track_partition(partition, stores[partition], histories[partition])
        self.observer.restored(time.monotonic() - started)
        log.info("partitions %s restored in %.2f s", sorted(partitions), time.monotonic() - started)

    def revoked(self, partitions: list[int]) -> None:
        """Close the partitions' tables."""
        self.observer.rebalanced("revoked", len(partitions))
        for partition in partitions:
            self.stores.close(partition)
            self.history_stores.close(partition)
            self.partitions.pop(partition, None)
        self.cache.clear()
        self.windows.clear()

    def process(self, records: list[Message]) -> list[Output]:
        """Decide each command; the records to write, each thread's state last."""
        self._step = _Step(commands=len(records))
        self.observer.begin()
        outputs: list[Output] = []
        for msg in records:
            self._process(msg, outputs)
        self._write_states(outputs)
        return outputs

    def committed(self) -> None:
        """Commit the tables and track the new deadlines."""
        self.stores.commit_all()
        self.history_stores.commit_all()
        for (partition, key), state in self._step.touched.items():
            self._track_deadline(partition, key, state)
        now = time.monotonic()
        self.stats.first_batch_at = self.stats.first_batch_at or now
        self.stats.last_batch_at = now
        self.stats.batches += 1
        self.stats.commands += self._step.commands
        self.observer.committed(self._step.commands)

    def aborted(self, error: KafkaError) -> float:
        """Drop the staged table writes and the caches; no pause."""
        self.stats.aborts += 1
        self.observer.aborted()
        self.stores.rollback_all()
        self.history_stores.rollback_all()
        self.cache.clear()
        self.windows.clear()
        return 0.0

    def after_step(self) -> None:
        """Send the ticks of due deadlines, every TICK_INTERVAL_S."""
        if time.monotonic() >= self._next_tick:
            self._tick()
            self._next_tick = time.monotonic() + TICK_INTERVAL_S
            self.observer.lag(self.loop.consumer, self.loop.positions)

    def _track_partition(self, partition: int, store: PartitionStore,
                         history: PartitionStore) -> None:
        """A restored partition: migrate any state written before the messages topic
        existed, and track its threads' deadlines."""
        migrated = migrate_partition(self, partition, store, MessageStore(history, self.codec))
        state = _Partition()
        for key, raw in store.items():
            due = next_deadline_ms(self.codec.decode_state_without_keys(raw),
                                   self.settings.policy)
            if due is not None:
                state.deadlines[key] = due
        self.partitions[partition] = state
        if migrated:
            log.info("partition %d: %d legacy threads migrated", partition, migrated)

    # --- one command ------------------------------------------------------------

    def _process(self, msg: Message, outputs: list[Output]) -> None:
        _, partition, _ = record_position(msg)
        key = msg.key() or b""
        try:
            meta, command = self.codec.decode_command(msg.value() or b"")
            if key != meta.thread_id.encode():
                raise DecodeError(f"record key {key!r} is not the command's thread_id {meta.thread_id!r}")
        except DecodeError as exc:
            outputs.append(self._dead_letter(msg, str(exc), type(exc).__name__))
            self.observer.command(None, "dead_lettered")
            return
        span = self.observer.start_decision(msg, meta.traceparent, command, meta.thread_id)
        # A thread touched earlier in the batch: its newest state is not in the store yet.
        touched, deleted = self._step.touched, self._step.deleted
        state = touched[(partition, key)] if (partition, key) in touched else \
            self._load(self.stores.get(partition), key)
        history = MessageStore(self.history_stores.get(partition), self.codec, self.windows, partition)
        reply_to = header_value(msg.headers(), REPLY_HEADER)
        reply = ((REPLY_HEADER, reply_to),) if reply_to else ()
        decision = self._decide(state, command, meta, partition, key, history, reply)
        if decision is None:
            self.observer.command(command, "unchanged")
            self.observer.end_decision(span, "unchanged", partition, key)
            return
        if isinstance(command, ReportAttemptCompleted) and decision.too_large_output:
            # Kept for the operator: the answer that could not be stored.
            outputs.append(self._dead_letter(
                msg, f"{FailureCode.OUTPUT_TOO_LARGE}: the answer is {output_bytes(command)} bytes, "
                f"the limit is {self.policy.max_output_bytes}", "OutputTooLarge"))
        oversized = next((o for o in decision.outputs
                          if len(o.key) + len(o.value or b"") > self.max_record_bytes), None)
        if oversized is not None:
            # No record of a command may stop the processor: the command goes to the
            # dead letters, and a run it was about ends instead of waiting forever.
            size = len(oversized.key) + len(oversized.value or b"")
            outputs.append(self._dead_letter(
                msg, f"{FailureCode.RECORD_TOO_LARGE}: its decision needs a {size}-byte {oversized.topic} "
                f"record, the limit is {self.max_record_bytes}", "RecordTooLarge"))
            decision = self._fail_reported_run(state, command, meta, partition, key, history,
                                               reply)
            if decision is None:
                self.observer.command(command, "dead_lettered")
                self.observer.end_decision(span, "dead_lettered", partition, key)
                return
        self.observer.command(command, "decided")
        headers = self.observer.end_decision(span, "decided", partition, key, decision.events)
        for out in decision.outputs:
            outputs.append(Output(out.topic, out.key, out.value,
                                  partition if out.partition is None else out.partition,
                                  self.history_stores.get(partition).changelog_delivered
                                  if out.topic == self.topics.messages else None,
                                  [*(headers or ()), *out.headers] if out.headers else headers))
        for record, seq, raw in decision.history:
            if record is None:
                history.erase(meta.thread_id, seq)
            else:
                assert raw is not None
                history.put(meta.thread_id, record, raw)
        self.cache[key] = decision.state
        touched[(partition, key)] = decision.state
        if decision.deleted:
            deleted.add((partition, key))
        else:
            deleted.discard((partition, key))

    def _fail_reported_run(self, state: ThreadState | None, command: Command, meta: EnvelopeMeta,
                           partition: int, key: bytes, history: MessageStore,
                           reply: tuple[tuple[str, bytes], ...]) -> _Decision | None:
        """The decision instead of one whose records cannot fit: a worker's report on
        the live attempt ends the run `record_too_large`; anything else decides nothing."""
        if not isinstance(command, WorkerReport):
            return None
        failed = ReportAttemptFailed(command.thread_id, command.run_id, command.attempt,
                                     command.worker_id, FailureCode.RECORD_TOO_LARGE, False, command.now_ms)
        decision = self._decide(state, failed, meta, partition, key, history, reply)
        if decision is None or any(len(o.key) + len(o.value or b"") > self.max_record_bytes
                                   for o in decision.outputs):
            return None
        return decision

    def _decide(self, state: ThreadState | None, command: Command, meta: EnvelopeMeta,
                partition: int, key: bytes, history: MessageStore,
                reply: tuple[tuple[str, bytes], ...] = ()) -> _Decision | None:
        """Decide `command` and encode every record it writes (nothing is produced);
        `reply` is the command's REPLY_HEADER, for its events."""
        known = _known(state, command, history)
        parts = None
        if isinstance(command, CopyThread) and state is not None and state.tenant == command.tenant:
            parts = import_parts(state, history, self.max_record_bytes)
            known = replace(known, copy_parts=len(parts) if parts is not None else MAX_PARTS + 1)
        events = decide(state, command, self.policy, known)
        if not events:
            return None
        outputs: list[_Output] = []
        writes: list[tuple[MessageRecord | None, int, bytes | None]] = []
        before = state
        accepted: dict[str, str] = {}  # user messages accepted by this very command: their texts
        stored_count = state.message_count if state is not None else 0  # the rest is in `writes`
        for index, event in enumerate(events):
            after = evolve(before, event, self.policy)
            owner = after or before
            event_meta = EnvelopeMeta(
                envelope_id=derived_envelope_id(meta.envelope_id, index), thread_id=meta.thread_id,
                tenant=owner.tenant if owner is not None else meta.tenant,
                produced_at_ms=now_ms(), traceparent=meta.traceparent,
                tracestate=meta.tracestate, schema_version=meta.schema_version,
            )
            outputs.append(_Output(self.topics.events, key, self.codec.encode_event(event, event_meta),
                                   (payload_header(event), *reply)))
            if isinstance(event, MessageAccepted):
                accepted[event.message_id] = event.text
            if isinstance(event, AttemptDispatched) and after is not None:
                outputs.append(self._dispatch(event, after, event_meta, key, history,
                                              accepted.get(event.message_id), writes, stored_count))
            lifecycle = lifecycle_record(event, before)
            if lifecycle is not None:
                outputs.append(_Output(self.topics.stream, key,
                                       self.codec.encode_stream(lifecycle, event_meta),
                                       tuple(stream_headers(lifecycle.payload))))
            for write in history_writes(before, event):
                self._history_outputs(write, meta.thread_id, event_meta, history, outputs, writes,
                                      before.message_count if before is not None else 0)
            if isinstance(event, HistoryImported) and isinstance(command, ImportHistory):
                for put in imported_writes(command):
                    self._history_outputs(put, meta.thread_id, event_meta, history, outputs,
                                          writes, 0)
            if isinstance(event, ThreadCopied) and isinstance(command, CopyThread) and \
                    state is not None and parts is not None:
                outputs += self._copy_outputs(command, state, parts, meta, len(events), reply)
            before = after
        self.observer.events(events)
        too_large = any(isinstance(e, RunFailed) and e.error == FailureCode.OUTPUT_TOO_LARGE for e in events)
        return _Decision(before, outputs, writes, deleted=state is not None and before is None,
                         too_large_output=too_large, events=tuple(events))

    def _copy_outputs(self, command: CopyThread, state: ThreadState,
                      parts: list[list[MessageRecord]], meta: EnvelopeMeta,
                      first_index: int, reply: tuple[tuple[str, bytes], ...]) -> list[_Output]:
        """The ImportHistory commands of a decided copy, keyed by the copy: on its
        partition by the partitioner every producer of commands uses (murmur2)."""
        key = command.target_thread_id.encode()
        outputs: list[_Output] = []
        for index, part in enumerate(import_commands(command, state, parts)):
            part_meta = EnvelopeMeta(
                envelope_id=derived_envelope_id(meta.envelope_id, first_index + index),
                thread_id=part.thread_id, tenant=part.tenant, produced_at_ms=now_ms(),
                traceparent=meta.traceparent, tracestate=meta.tracestate,
                schema_version=meta.schema_version)
            outputs.append(_Output(self.topics.commands, key,
                                   self.codec.encode_command(part, part_meta), reply,
                                   partition=PARTITION_UA))
        return outputs

    def _history_outputs(self, write: HistoryWrite, thread_id: str, meta: EnvelopeMeta,
                         history: MessageStore, outputs: list[_Output],
                         writes: list[tuple[MessageRecord | None, int, bytes | None]],
                         message_count: int) -> None:
        match write:
            case MessagePut():
                record = MessageRecord(write.seq, write.message, write.run_status,
                                       write.run_attempts, write.parent_seq)
            case RunStatusChanged():
                stored = _staged(writes, write.seq) or history.record(thread_id, write.seq)
                if stored is None:
                    return
                record = replace(stored, run_status=write.run_status,
                                 run_attempts=write.run_attempts)
            case MessageRemoved():
                outputs.append(_Output(self.topics.messages, message_key(thread_id, write.seq),
                                       None))
                writes.append((None, write.seq, None))
                if write.parent_seq is None:
                    return  # its children go on at the seq before it: its parent
                # Only what was stored while its run was active follows it: a few records.
                for seq in range(write.seq + 1, message_count):
                    stored = _staged(writes, seq) or history.record(thread_id, seq)
                    moved = relinked(stored, write) if stored is not None else None
                    if moved is not None:
                        raw = self.codec.encode_message(moved, meta)
                        outputs.append(_Output(self.topics.messages, message_key(thread_id, seq), raw))
                        writes.append((moved, seq, raw))
                return
            case HistoryErased():
                for seq in range(write.message_count):
                    outputs.append(_Output(self.topics.messages, message_key(thread_id, seq), None))
                    writes.append((None, seq, None))
                return
        raw = self.codec.encode_message(record, meta)
        outputs.append(_Output(self.topics.messages, message_key(thread_id, record.seq), raw))
        writes.append((record, record.seq, raw))

    def _write_states(self, outputs: list[Output]) -> None:
        """Each thread's state as the batch leaves it, to the table and the changelog.

        Once per thread and batch, not per command: the batch commits as one
        transaction, so no reader could see a state between two of its commands.
        A deleted thread's state becomes a tombstone."""
        for (partition, key), state in self._step.touched.items():
            store = self.stores.get(partition)
            if state is None:
                if (partition, key) in self._step.deleted:
                    store.delete(key)
                    outputs.append(Output(self.topics.threads, key, None, partition,
                                          store.changelog_delivered,
                                          self.observer.state_headers(partition, key)))
                continue
            encoded = self.codec.encode_state(state)
            store.put(key, encoded)
            outputs.append(Output(self.topics.threads, key, encoded, partition,
                                  store.changelog_delivered, self.observer.state_headers(partition, key)))

    def _load(self, store: PartitionStore, key: bytes) -> ThreadState | None:
        if key in self.cache:
            return self.cache[key]
        raw = store.get(key)
        state = self.codec.decode_state(raw) if raw is not None else None
        if len(self.cache) > 50_000:
            self.cache.clear()
        self.cache[key] = state
        return state

    def _dispatch(self, event: AttemptDispatched, state: ThreadState, meta: EnvelopeMeta,
                  key: bytes, history: MessageStore, input_text: str | None,
                  staged: Sequence[tuple[MessageRecord | None, int, bytes | None]] = (),
                  stored_count: int = 0) -> _Output:
        """The dispatch record: the user message and as much of the history above it
        on its branch as the context budget (THREADLINE_CONTEXT_CHARS) and the record
        limit allow. `staged` is what this decision wrote so far (not in `history`
        yet); `history` holds every message below `stored_count`."""
        run = state.active_run
        seq = run.message_seq if run is not None else -1
        if input_text is None:  # a retry, a queued message or a regenerate: stored before
            stored = history.record(state.thread_id, seq) if seq >= 0 else None
            input_text = stored.message.text if stored is not None else ""
        newest = _branch_context(state, history, staged, stored_count)
        budget = self.settings.worker.context_chars
        while True:
            context = context_window(newest, budget, HISTORY_LIMIT)
            dispatch = dispatch_record(event, state.thread_id, input_text, context,
                                       run.journal if run is not None else ())
            value = self.codec.encode_dispatch(dispatch, meta)
            # Characters are not bytes: halve the budget until the record fits.
            if len(value) + len(key) <= self.max_record_bytes or not context:
                return _Output(self.topics.dispatch, key, value)
            budget = sum(len(m.text) for m in context) // 2

    def _dead_letter(self, msg: Message, reason: str, error_type: str) -> Output:
        topic, partition, offset = record_position(msg)
        log.warning("dead-lettering %s[%d]@%d: %s", topic, partition, offset, reason)
        self.observer.dead_letter(error_type)
        # A record near the broker's size limit would not fit in a dead letter that also
        # carries it: the produce would fail, the processor crash, and the restarted one
        # meet the same record again. Keep a prefix of anything that large.
        value, key = msg.value() or b"", msg.key()
        if len(value) > DEAD_LETTER_MAX_BYTES or len(key or b"") > DEAD_LETTER_MAX_BYTES:
            reason += (f" (dead letter keeps the first {DEAD_LETTER_MAX_BYTES} bytes of its "
                       f"{len(key or b'')}-byte key and {len(value)}-byte value)")
            value, key = value[:DEAD_LETTER_MAX_BYTES], key and key[:DEAD_LETTER_MAX_BYTES]
        record = DeadLetter(source_topic=topic, source_partition=partition, source_offset=offset,
                            key=key, value=value, reason=reason,
                            error_type=error_type, failed_at_ms=now_ms())
        # Compacted topics refuse null keys; a keyless record is keyed by its position.
        key = key or f"{topic}/{partition}/{offset}".encode()
        return Output(self.topics.dead_letter, key, self.codec.encode_dead_letter(record), partition,
                      headers=header_of(record_traceparent(msg.headers(), None)))

    # --- the clock ----------------------------------------------------------------

    def _track_deadline(self, partition: int, key: bytes, state: ThreadState | None) -> None:
        part = self.partitions.get(partition)
        if part is None:
            return
        due = next_deadline_ms(state, self.settings.policy) if state is not None else None
        if due is None:
            part.deadlines.pop(key, None)
        else:
            part.deadlines[key] = due
        part.ticks_sent.pop(key, None)

    def _tick(self) -> None:
        now = now_ms()
        tracked = due_now = ticks = 0
        for part in self.partitions.values():
            tracked += len(part.deadlines)
            for key, due in part.deadlines.items():
                due_now += due <= now
                if due > now or now - part.ticks_sent.get(key, -TICK_RESEND_MS) < TICK_RESEND_MS:
                    continue
                ticks += 1
                state = self.cache.get(key)
                tenant = state.tenant if state is not None else ""
                thread_id = key.decode()
                meta = EnvelopeMeta(envelope_id=str(uuid.uuid4()), thread_id=thread_id,
                                    tenant=tenant, produced_at_ms=now, traceparent=None,
                                    tracestate=None, schema_version=1)
                self.ticker.produce(self.topics.commands,
                                    self.codec.encode_command(CheckDeadlines(thread_id, now), meta), key)
                part.ticks_sent[key] = now
        self.ticker.poll(0)
        self.observer.deadlines(tracked, due_now, ticks)


_ENVELOPE_ROOM = 16 * 1024  # of a record, for the envelope and ids around an answer


def _unawaited(msg: Message) -> bool:
    """Whether nobody waits for the record's decision (`UNAWAITED`; a record without
    the header, from an older writer, is waited for)."""
    return payload_named(msg.headers()) in UNAWAITED


def _known(state: ThreadState | None, command: Command, history: MessageStore) -> Known:
    """What the history table knows that `command` needs decided (`Known`)."""
    if state is None:
        return NOTHING_KNOWN
    thread_id = state.thread_id
    match command:
        case PostUserMessage():
            return Known(history.run_of_message(thread_id, command.message_id))
        case RegenerateAnswer():
            run_id = regenerate_run_id_for(thread_id, command.idempotency_key)
            return _target(history, thread_id, command.message_id,
                           run_id if history.answered(thread_id, run_id) else None)
        case EditMessage():
            return _target(history, thread_id, command.message_id,
                           history.run_of_message(thread_id, command.new_message_id))
        case _:
            return NOTHING_KNOWN


def _target(history: MessageStore, thread_id: str, message_id: str,
            run_id: str | None) -> Known:
    """`Known` of a regenerate or edit: the seq and parent of the user message it names."""
    seq = history.seq_of_message(thread_id, message_id)
    link = history.link(thread_id, seq) if seq is not None else None
    if seq is None or link is None or link.message.role != "user":
        return Known(run_id)
    return Known(run_id, target_seq=seq, target_parent_seq=parent_seq_of(link))


def _branch_context(state: ThreadState, history: MessageStore,
                    staged: Sequence[tuple[MessageRecord | None, int, bytes | None]],
                    stored_count: int) -> list[HistoryMessage]:
    """The active run's context, newest first: its branch's path above it, less the
    messages still queued (`branches.run_context_seqs`), at most HISTORY_LIMIT."""
    thread_id = state.thread_id
    links: dict[int, Linked | None] = {}
    # The newest stored messages, from the thread's window when it is cached: every
    # seq from `covered` to `stored_count` not among them is not stored.
    newest = history.links(thread_id, stored_count, HISTORY_LIMIT + len(state.queued))
    covered = newest[-1].seq if len(newest) == HISTORY_LIMIT + len(state.queued) else 0
    links.update((link.seq, link) for link in newest)
    links.update((s, r) for r, s, _ in staged)  # in order: the last write of a seq wins

    def record_at(seq: int) -> Linked | None:
        if seq not in links:
            links[seq] = history.link(thread_id, seq) if seq < covered else None
        return links[seq]

    context: list[HistoryMessage] = []
    for seq in run_context_seqs(state, record_at):
        found = links[seq]
        assert isinstance(found, MessageRecord | ContextLink)
        message = found.message
        context.append(message if isinstance(message, HistoryMessage)
                       else HistoryMessage(message.message_id, message.role, message.text))
        if len(context) >= HISTORY_LIMIT:
            break
    return context


def _staged(writes: list[tuple[MessageRecord | None, int, bytes | None]],
            seq: int) -> MessageRecord | None:
    """Message `seq` as written earlier by the same decision, if it was."""
    return next((r for r, s, _ in reversed(writes) if s == seq and r is not None), None)


def run_processor(settings: Settings) -> int:
    """The processor's entry point: runs it until SIGTERM or SIGINT asks it to stop; returns exit code 0."""
    processor = Processor(settings)

    def _stop(*_: object) -> None:
        processor.stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    processor.run()
    return 0
