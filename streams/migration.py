"""In-place migration of thread states written before the messages topic existed.

Such a state (ThreadState as written by release 0.1) carries the whole history:
`messages`, `runs` and `run_by_message`. The processor migrates every one of its
partition's states right after restoring the partition and before it decides
anything there: each stored message becomes its own messages-topic record
(seq = its position), and the state is rewritten bounded. Both go out in Kafka
transactions of at most `Settings.migration_batch` threads, so a processor killed mid-migration leaves
each thread either untouched or migrated whole; the next owner of the partition
finds the rest still in the old form and carries on. Readers of the old form see
it until then (the gateway keeps serving the thread from the old state's record).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from streams.clock import now_ms
from streams.core.domain import RunRecord, StoredMessage, ThreadState
from streams.core.history import message_key
from streams.core.ids import uuid5_text
from streams.core.records import MessageRecord
from streams.kafka.loop import Output
from streams.kafka.state_store import PartitionStore
from streams.message_store import MessageStore
from streams.wire import EnvelopeMeta

if TYPE_CHECKING:
    from streams.processor import Processor

__all__ = ["migrate_partition", "migrated"]

log = logging.getLogger("threadline.migration")



def migrated(state: ThreadState, messages: tuple[StoredMessage, ...],
             runs: Mapping[str, RunRecord], now_ms: int) -> tuple[ThreadState, list[MessageRecord]]:
    """The bounded state and the message records of a state in the old form. Pure."""
    records = []
    for seq, message in enumerate(messages):
        run = runs.get(message.run_id) if message.role == "user" else None
        records.append(MessageRecord(seq, message, run.status if run else None,
                                     run.attempts if run else 0))
    last_run = next((r for r in reversed(list(runs.values())) if r.status.is_terminal), None)
    active = state.active_run
    if active is not None:
        seq = next((i for i, m in enumerate(messages)
                    if m.role == "user" and m.message_id == active.message_id), -1)
        accepted = messages[seq].created_at_ms if seq >= 0 else active.attempt_started_ms
        active = replace(active, message_seq=seq, accepted_at_ms=accepted)
    keys = {k: replace(r, at_ms=now_ms) if r.at_ms == 0 else r for k, r in state.idempotency.items()}
    updated = max([state.created_at_ms, *(m.created_at_ms for m in messages)])
    return replace(state, active_run=active, message_count=len(messages), run_count=len(runs),
                   last_run=last_run, idempotency=keys, updated_at_ms=updated), records


def migrate_partition(processor: Processor, partition: int, store: PartitionStore,
                      history: MessageStore) -> int:
    """Migrate every old-form state of the partition; returns how many there were."""
    legacy = []
    for key, raw in store.items():
        messages, runs = processor.codec.decode_legacy_history(raw)
        if messages or runs:
            legacy.append((key, raw, messages, runs))
    # THREADLINE_MIGRATION_BATCH threads a transaction: bounds a transaction's size.
    batch = processor.settings.processor.migration_batch
    for start in range(0, len(legacy), batch):
        _migrate_batch(processor, partition, store, history, legacy[start:start + batch])
    return len(legacy)


def _migrate_batch(processor: Processor, partition: int, store: PartitionStore,
                   history: MessageStore,
                   batch: list[tuple[bytes, bytes, tuple[StoredMessage, ...], dict[str, RunRecord]]]) \
        -> None:
    topics = processor.topics
    now = now_ms()
    outputs: list[Output] = []
    try:
        for key, raw, messages, runs in batch:
            state, records = migrated(processor.codec.decode_state(raw), messages, runs, now)
            for record in records:
                meta = EnvelopeMeta(envelope_id=_migration_id(state.thread_id, record.seq),
                                    thread_id=state.thread_id, tenant=state.tenant,
                                    produced_at_ms=now)
                value = processor.codec.encode_message(record, meta)
                outputs.append(Output(topics.messages, message_key(state.thread_id, record.seq),
                                      value, partition))
                history.put(state.thread_id, record, value)
            encoded = processor.codec.encode_state(state)
            store.put(key, encoded)
            outputs.append(Output(topics.threads, key, encoded, partition))
        processor.loop.commit(outputs, [])
    except Exception:
        # Nothing of the batch is committed: drop what was staged and let the role
        # crash; the next owner of the partition migrates it again.
        store.rollback()
        history.store.rollback()
        raise
    store.commit()
    history.store.commit()
    log.info("partition %d: migrated %d threads to the messages topic", partition, len(batch))


def _migration_id(thread_id: str, seq: int) -> str:
    # Stable, so a migration repeated after a crash writes the very same records.
    digest = hashlib.sha1(f"migrate:{len(thread_id)}:{thread_id}:{seq}".encode(
        "utf-8", "surrogatepass"), usedforsecurity=False).digest()
    return uuid5_text(digest)
