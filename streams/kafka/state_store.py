"""Per-partition RocksDB tables (rocksdict) that only ever hold committed state.

Why not write straight to RocksDB: under exactly-once, a write made before the
Kafka transaction commits survives a `kill -9` although the transaction is
aborted, and the restarted processor would then trust state whose events were
never published (Faust's EOS mode has this flaw: it persists table rows to
RocksDB at once and only the offset on commit). Here a batch's writes wait in
an overlay; `commit()` moves them into RocksDB together with the changelog
offset they reach, in one atomic RocksDB write batch, after Kafka committed.
On assignment a partition restores from its checkpoint to the end of the
changelog (read_committed), so it is never behind nor ahead of Kafka.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rocksdict import Options, Rdict, WriteBatch

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

__all__ = ["PartitionStore", "TableStores"]

_CHECKPOINT = b"\x00checkpoint"  # sorts before every thread id


class PartitionStore:
    """One partition's table: key -> encoded row, plus its changelog checkpoint."""

    def __init__(self, path: Path) -> None:
        self.path = path
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self._db = Rdict(str(path), opts)
        self._overlay: dict[bytes, bytes | None] = {}  # None: a staged delete
        self._pending_offset: int | None = None

    @property
    def checkpoint(self) -> int:
        """The changelog offset up to which this store holds committed state."""
        raw = self._db.get(_CHECKPOINT)
        return int(raw) if raw is not None else 0

    def get(self, key: bytes) -> bytes | None:
        """The row of `key` as staged, else as committed; None if there is none."""
        if key in self._overlay:
            return self._overlay[key]
        value: bytes | None = self._db.get(key)
        return value

    def put(self, key: bytes, value: bytes, changelog_offset: int | None = None) -> None:
        """Stage a write; it reaches RocksDB at `commit()`."""
        self._overlay[key] = value
        if changelog_offset is not None:
            self._pending_offset = max(self._pending_offset or 0, changelog_offset + 1)

    def delete(self, key: bytes, changelog_offset: int | None = None) -> None:
        """Stage a delete (a tombstone); it reaches RocksDB at `commit()`."""
        self._overlay[key] = None
        if changelog_offset is not None:
            self._pending_offset = max(self._pending_offset or 0, changelog_offset + 1)

    def note_offset(self, changelog_offset: int) -> None:
        """Note that the changelog holds this batch up to `changelog_offset` (inclusive)."""
        self._pending_offset = max(self._pending_offset or 0, changelog_offset + 1)

    def changelog_delivered(self, err: KafkaError | None, msg: Message) -> None:
        """Delivery report of a record of this table's changelog: the checkpoint moves past it."""
        offset = msg.offset()
        if err is None and offset is not None:
            self.note_offset(offset)

    def commit(self) -> None:
        """Move the staged writes and the checkpoint into RocksDB, atomically."""
        if not self._overlay and self._pending_offset is None:
            return
        batch = WriteBatch(raw_mode=True)
        for key, value in self._overlay.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if self._pending_offset is not None:
            batch.put(_CHECKPOINT, str(self._pending_offset).encode())
        self._db.write(batch)
        self._overlay.clear()
        self._pending_offset = None

    def rollback(self) -> None:
        """Drop the staged writes: the transaction they belonged to aborted."""
        self._overlay.clear()
        self._pending_offset = None

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """The committed rows (not the staged ones)."""
        for key, value in self._db.items():
            if isinstance(key, bytes) and key != _CHECKPOINT:
                yield key, value

    def close(self) -> None:
        """Drop the staged writes and close the database."""
        self.rollback()
        self._db.close()


class TableStores:
    """One table of a role, one RocksDB per partition, opened on assignment."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.name = name
        self.root.mkdir(parents=True, exist_ok=True)
        self._open: dict[int, PartitionStore] = {}

    def path(self, partition: int) -> Path:
        """The folder of the partition's RocksDB."""
        return self.root / f"{self.name}-{partition}.rocksdb"

    def open(self, partition: int) -> PartitionStore:
        """The partition's store, opened if it is not yet."""
        if partition not in self._open:
            self._open[partition] = PartitionStore(self.path(partition))
        return self._open[partition]

    def wipe(self, partition: int) -> None:
        """Close the partition's store and delete its files (its changelog is rebuilt)."""
        self.close(partition)
        shutil.rmtree(self.path(partition), ignore_errors=True)

    def get(self, partition: int) -> PartitionStore:
        """The open store of an assigned partition."""
        return self._open[partition]

    def close(self, partition: int) -> None:
        """Close the partition's store, dropping staged writes."""
        store = self._open.pop(partition, None)
        if store is not None:
            store.close()

    def close_all(self) -> None:
        """Close every open store."""
        for partition in list(self._open):
            self.close(partition)

    def commit_all(self) -> None:
        """Commit every open store's staged writes."""
        for store in self._open.values():
            store.commit()

    def rollback_all(self) -> None:
        """Drop every open store's staged writes."""
        for store in self._open.values():
            store.rollback()

    def each(self, fn: Callable[[int, PartitionStore], None]) -> None:
        """Call `fn` with each open partition and its store."""
        for partition, store in self._open.items():
            fn(partition, store)
