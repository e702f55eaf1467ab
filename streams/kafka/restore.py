"""Restoring tables on assignment: changelog partitions read to their end.

A restore reads read_committed, so a table never holds what an aborted or still
open transaction wrote; it runs before the partitions are assigned (inside the
assignment callback), so no input is processed on a table that is behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from streams.config import Settings
from streams.kafka.clients import restore_consumer_config
from streams.kafka.state_store import PartitionStore, TableStores

__all__ = ["ChangelogReader", "restore_tables"]

log = logging.getLogger("threadline.kafka.restore")

COMMIT_EVERY = 10_000  # restored records between store commits: bounds the overlay


class ChangelogReader:
    """A consumer outside the group's assignment that reads partitions to their end."""

    def __init__(self, settings: Settings, group_id: str) -> None:
        self._consumer = Consumer(restore_consumer_config(settings, group_id))

    def __enter__(self) -> ChangelogReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._consumer.close()

    def all_watermarks(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """Each partition's first offset and end offset (read_committed: the last stable
        offset). One request each, on this reader's consumer: an admin client of its
        own would pay for its own connection and metadata first (seen: 3 s at load)."""
        marks = {}
        for partition in partitions:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                             timeout=30)
            marks[partition] = (int(low), int(high))
        return marks

    def read(self, topic: str, starts: dict[int, int], apply: Callable[[Message], None], *,
             ends: dict[int, int] | None = None) -> int:
        """Hand every record of `topic` from each partition's start offset up to its
        current end (`ends`, else asked for) to `apply`, in order; returns how many there were.

        A partition is done at its end-of-partition event or once its position
        reaches the end offset read before: a transaction's commit marker takes the
        last offset and is never handed over, so a checkpoint just below the end
        has nothing left to read. `consume(n, timeout)` waits for n records or the
        whole timeout, so each call asks only for what is already fetched, then
        waits for the first record (or end event) of the next fetch."""
        if ends is None:
            ends = {p: high for p, (_, high) in self.all_watermarks(topic, list(starts)).items()}
        todo = {p: start for p, start in starts.items() if start < ends[p]}
        if not todo:
            return 0
        self._consumer.assign([TopicPartition(topic, p, start) for p, start in sorted(todo.items())])
        count = 0
        try:
            while todo:
                batch = self._consumer.consume(500, timeout=0) or self._consumer.consume(1, timeout=0.2)
                for msg in batch:
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            todo.pop(msg.partition() or 0, None)
                            continue
                        raise KafkaException(error)
                    apply(msg)
                    count += 1
                    offset = msg.offset()
                    if offset is not None and offset + 1 >= ends[msg.partition() or 0]:
                        todo.pop(msg.partition() or 0, None)
                if todo and not batch:
                    self._drop_read_to_end(topic, todo, ends)
        finally:
            self._consumer.unassign()
        return count

    def _drop_read_to_end(self, topic: str, todo: dict[int, int], ends: dict[int, int]) -> None:
        """Forget the partitions whose position reached their end (past a marker)."""
        positions = self._consumer.position([TopicPartition(topic, p) for p in todo])
        for tp in positions:
            if tp.offset >= 0 and tp.offset >= ends[tp.partition]:
                todo.pop(tp.partition, None)


def restore_tables(reader: ChangelogReader, tables: TableStores, topic: str,
                   partitions: list[int],
                   apply_record: Callable[[PartitionStore, bytes, bytes | None, int], None]) \
        -> dict[int, PartitionStore]:
    """Open the partitions' stores and bring each from its checkpoint to the end of its
    changelog `topic`, all in one read; a checkpoint outside the changelog (the topic
    was recreated or trimmed) wipes that store and restores it whole."""
    stores: dict[int, PartitionStore] = {}
    starts: dict[int, int] = {}
    marks = reader.all_watermarks(topic, partitions)
    for partition in partitions:
        store = tables.open(partition)
        low, high = marks[partition]
        start = store.checkpoint
        if start > high or start < low:
            tables.wipe(partition)
            store = tables.open(partition)
            start = low
        stores[partition], starts[partition] = store, start
    restored = dict.fromkeys(partitions, 0)

    def apply(msg: Message) -> None:
        partition, offset = msg.partition() or 0, msg.offset()
        assert offset is not None
        store = stores[partition]
        apply_record(store, msg.key() or b"", msg.value(), offset)
        restored[partition] += 1
        if restored[partition] % COMMIT_EVERY == 0:
            store.commit()  # the checkpoint moves with it

    reader.read(topic, starts, apply, ends={p: high for p, (_, high) in marks.items()})
    for partition, store in stores.items():
        if restored[partition]:
            store.commit()
        log.info("%s[%d]: %d changelog records from %d", topic, partition, restored[partition],
                 starts[partition])
    return stores
