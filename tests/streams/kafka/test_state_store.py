"""The state store holds only committed state: staged writes reach RocksDB with
their changelog checkpoint at `commit`, and an abort (`rollback`) leaves no trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streams.kafka.state_store import PartitionStore, TableStores


class _Delivered:
    """A delivery report's record, as far as the store reads it."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


def _delivered(offset: int) -> Any:
    return _Delivered(offset)


def test_staged_writes_are_read_back_but_reach_rocksdb_only_at_commit(tmp_path: Path) -> None:
    """Shows a staged write is read back at once but reaches RocksDB, with its checkpoint, only on commit."""
    store = PartitionStore(tmp_path / "db")
    store.put(b"a", b"1", changelog_offset=4)
    assert store.get(b"a") == b"1"
    assert list(store.items()) == [] and store.checkpoint == 0
    store.commit()
    assert list(store.items()) == [(b"a", b"1")] and store.checkpoint == 5
    store.close()
    reopened = PartitionStore(tmp_path / "db")
    assert reopened.get(b"a") == b"1" and reopened.checkpoint == 5
    reopened.close()


def test_a_rollback_drops_the_staged_writes_and_their_checkpoint(tmp_path: Path) -> None:
    """Shows a rollback drops staged puts, deletes and delivered changelog offsets, keeping the committed."""
    store = PartitionStore(tmp_path / "db")
    store.put(b"a", b"1", changelog_offset=0)
    store.commit()
    store.delete(b"a")
    store.put(b"b", b"2")
    store.changelog_delivered(None, _delivered(9))
    assert store.get(b"a") is None and store.get(b"b") == b"2"
    store.rollback()
    assert store.get(b"a") == b"1" and store.get(b"b") is None
    store.commit()
    assert store.checkpoint == 1
    store.close()


def test_a_delivered_changelog_record_moves_the_checkpoint_a_failed_one_does_not(tmp_path: Path) -> None:
    """Shows only a delivered changelog record moves the checkpoint; a failed delivery leaves it."""
    store = PartitionStore(tmp_path / "db")
    store.put(b"a", b"1")
    store.changelog_delivered(None, _delivered(7))
    store.changelog_delivered(object(), _delivered(8))  # type: ignore[arg-type]
    store.commit()
    assert store.checkpoint == 8
    store.close()


def test_a_wiped_partition_opens_empty(tmp_path: Path) -> None:
    """Shows a wiped partition's store opens again empty, with checkpoint 0."""
    tables = TableStores(tmp_path, "threads")
    tables.open(0).put(b"a", b"1", changelog_offset=0)
    tables.commit_all()
    tables.wipe(0)
    assert tables.open(0).get(b"a") is None and tables.get(0).checkpoint == 0
    tables.close_all()
