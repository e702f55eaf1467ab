"""Restoring tables on assignment: changelog partitions read to their end.

A restore reads read_committed, so a table never holds what an aborted or still
open transaction wrote; it runs before the partitions are assigned (inside the
assignment callback), so no input is processed on a table that is behind.

It first waits until every transaction open on the changelog partitions when it
began has ended (`stable_watermarks`). Read_committed ends at the first offset of an
open transaction (the last stable offset), and what committed after it is hidden
until it ends: a restore that stopped there would miss committed records, and a
checkpoint past it would look like one outside the changelog and wipe the table
(chaos seed 3105: a previous owner's transaction left open past its revocation; the
new owner's next restore lost the owner's own commits, its state went back and step
reports were recorded again). At an assignment only a deposed writer can have one
open, and it ends within the transaction timeout: by its own restart, by the
takeover's fence, or by the coordinator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from streams.config import Settings
from streams.kafka.clients import restore_consumer_config
from streams.kafka.state_store import PartitionStore, TableStores

__all__ = ["ChangelogReader", "restore_tables"]

log = logging.getLogger("threadline.kafka.restore")

COMMIT_EVERY = 10_000  # restored records between store commits: bounds the overlay
OPEN_POLL_S = 0.05  # between looks at a partition whose transaction is still open
OPEN_LOG_EVERY_S = 5.0


class ChangelogReader:
    """A consumer outside the group's assignment that reads partitions to their end."""

    def __init__(self, settings: Settings, group_id: str) -> None:
        self._config = restore_consumer_config(settings, group_id)
        self._consumer = Consumer(self._config)
        self._uncommitted: Consumer | None = None  # for high watermarks, made when needed

    def __enter__(self) -> ChangelogReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._consumer.close()
        if self._uncommitted is not None:
            self._uncommitted.close()

    def stable_watermarks(self, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """`all_watermarks` once no transaction that was open on the partitions when
        called is open any more: its end offsets are then the ends of everything
        committed so far (see the module doc). Waits as long as that takes."""
        if self._uncommitted is None:
            self._uncommitted = Consumer({**self._config, "isolation.level": "read_uncommitted"})
        highs = {p: int(self._uncommitted.get_watermark_offsets(TopicPartition(topic, p),
                                                                timeout=30)[1])
                 for p in partitions}
        logged_at = None
        while True:
            marks = self.all_watermarks(topic, partitions)
            open_at = {p: marks[p][1] for p in partitions if marks[p][1] < highs[p]}
            if not open_at:
                if logged_at is not None:
                    log.warning("%s%s: the open transactions ended", topic, sorted(highs))
                return marks
            if logged_at is None or time.monotonic() - logged_at >= OPEN_LOG_EVERY_S:
                logged_at = time.monotonic()
                log.warning("%s: waiting for transactions open at %s to end (a deposed "
                            "writer's: committed records may follow them)", topic,
                            ", ".join(f"[{p}]@{o} (end {highs[p]})"
                                      for p, o in sorted(open_at.items())))
            time.sleep(OPEN_POLL_S)

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
    changelog `topic`, all in one read, once no transaction open on them when called
    is open any more; a checkpoint outside the changelog (the topic was recreated or
    trimmed) wipes that store and restores it whole."""
    stores: dict[int, PartitionStore] = {}
    starts: dict[int, int] = {}
    marks = reader.stable_watermarks(topic, partitions)
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
