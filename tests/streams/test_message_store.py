"""The processor's history table on a real RocksDB: what a dispatch reads as context,
the duplicate index, erasing, and restoring from the changelog's records."""

from __future__ import annotations

from pathlib import Path

import hypothesis
from hypothesis import strategies as st

from streams.domain import RunStatus, StoredMessage
from streams.history import context_window, message_key
from streams.message_store import MessageStore, _context_row, _row
from streams.records import HistoryMessage, MessageRecord
from streams.serialization import Codec, new_meta
from streams.state_store import PartitionStore
from streams.thread import run_id_for

CODEC = Codec()
T = "t/1"  # a slash in the id: keys must still be unambiguous


def _record(seq: int, text: str, role: str = "user") -> tuple[MessageRecord, bytes]:
    message = StoredMessage(f"m-{seq}", role, text, run_id_for(T, f"m-{seq}"), seq)
    record = MessageRecord(seq, message, RunStatus.DISPATCHED if role == "user" else None)
    return record, CODEC.encode_message(record, new_meta(T, "x", 1))


def test_context_reads_the_newest_messages_as_stored(tmp_path: Path) -> None:
    store = MessageStore(PartitionStore(tmp_path / "db"), CODEC)
    texts = ["hi", "héllo ✈️", "a\x00b", "", "last"]  # (Avro itself refuses lone surrogates)
    for seq, text in enumerate(texts):
        record, raw = _record(seq, text, "user" if seq % 2 == 0 else "assistant")
        store.put(T, record, raw)
    store.store.commit()
    newest = list(store.newest_first(T, len(texts)))
    assert newest == [HistoryMessage(f"m-{s}", "user" if s % 2 == 0 else "assistant", texts[s])
                      for s in reversed(range(len(texts)))]
    assert context_window(store.newest_first(T, 4), 1_000, 2) == tuple(reversed(newest[1:3]))
    assert store.run_of_message(T, "m-2") == run_id_for(T, "m-2")
    assert store.run_of_message(T, "m-1") is None  # answers are not posts
    store.erase(T, 2)
    assert store.run_of_message(T, "m-2") is None
    assert [m.message_id for m in store.newest_first(T, 5)] == ["m-4", "m-3", "m-1", "m-0"]


def test_rows_without_context_fall_back_to_the_record(tmp_path: Path) -> None:
    db = PartitionStore(tmp_path / "db")
    store = MessageStore(db, CODEC)
    record, raw = _record(0, "stored before context rows")
    store.put(T, record, raw)
    db.delete(_context_row(T, 0))
    db.commit()
    assert db.get(_row(T, 0)) is not None
    assert list(store.newest_first(T, 1)) == [
        HistoryMessage("m-0", "user", "stored before context rows")]


@hypothesis.given(texts=st.lists(st.text(st.characters(codec="utf-8")),
                                 min_size=1, max_size=8))
def test_a_restore_from_the_changelog_gives_the_same_context(texts: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        written = MessageStore(PartitionStore(Path(folder) / "a"), CODEC)
        restored = MessageStore(PartitionStore(Path(folder) / "b"), CODEC)
        for seq, text in enumerate(texts):
            record, raw = _record(seq, text)
            written.put(T, record, raw)
            restored.restore(message_key(T, seq), raw, seq)
        restored.restore(message_key(T, 0), None, len(texts))  # a tombstone
        written.erase(T, 0)
        assert list(written.newest_first(T, len(texts))) == \
            list(restored.newest_first(T, len(texts)))
        assert restored.run_of_message(T, "m-0") is None
