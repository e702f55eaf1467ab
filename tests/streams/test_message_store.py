"""The processor's history table on a real RocksDB: what a dispatch reads as context,
the duplicate index, erasing, and restoring from the changelog's records."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import hypothesis
from hypothesis import strategies as st

from streams.core.domain import RunStatus, StoredMessage
from streams.core.history import context_window, message_key
from streams.core.ids import regenerate_run_id_for, run_id_for
from streams.core.records import HistoryMessage, MessageRecord
from streams.kafka.state_store import PartitionStore
from streams.message_store import ContextWindows, MessageStore, _context_row, _row
from streams.wire import Codec, new_meta

CODEC = Codec()
T = "t/1"  # a slash in the id: keys must still be unambiguous


def _record(seq: int, text: str, role: str = "user") -> tuple[MessageRecord, bytes]:
    message = StoredMessage(f"m-{seq}", role, text, run_id_for(T, f"m-{seq}"), seq)
    record = MessageRecord(seq, message, RunStatus.DISPATCHED if role == "user" else None)
    return record, CODEC.encode_message(record, new_meta(T, "x", 1))


def test_context_reads_the_newest_messages_as_stored(tmp_path: Path) -> None:
    """The store reads a thread's newest messages back as written, maps posts to runs, and erases."""
    store = MessageStore(PartitionStore(tmp_path / "db"), CODEC)
    texts = ["hi", "héllo ✈️", "a\x00b", "", "last"]  # (Avro itself refuses lone surrogates)
    for seq, text in enumerate(texts):
        record, raw = _record(seq, text, "user" if seq % 2 == 0 else "assistant")
        store.put(T, record, raw)
    store.store.commit()
    newest = store.context(T, len(texts), 50)
    assert newest == [HistoryMessage(f"m-{s}", "user" if s % 2 == 0 else "assistant", texts[s])
                      for s in reversed(range(len(texts)))]
    assert context_window(store.context(T, 4, 50), 1_000, 2) == tuple(reversed(newest[1:3]))
    assert store.run_of_message(T, "m-2") == run_id_for(T, "m-2")
    assert store.run_of_message(T, "m-1") is None  # answers are not posts
    store.erase(T, 2)
    assert store.run_of_message(T, "m-2") is None
    assert [m.message_id for m in store.context(T, 5, 50)] == ["m-4", "m-3", "m-1", "m-0"]


def test_rows_without_context_fall_back_to_the_record(tmp_path: Path) -> None:
    """A message stored without its context row is read from its full record."""
    db = PartitionStore(tmp_path / "db")
    store = MessageStore(db, CODEC)
    record, raw = _record(0, "stored before context rows")
    store.put(T, record, raw)
    db.delete(_context_row(T, 0))
    db.commit()
    assert db.get(_row(T, 0)) is not None
    assert store.context(T, 1, 50) == [
        HistoryMessage("m-0", "user", "stored before context rows")]


@hypothesis.settings(deadline=None)  # two RocksDB opens an example: slow on a loaded machine
@hypothesis.given(texts=st.lists(st.text(st.characters(codec="utf-8")),
                                 min_size=1, max_size=8))
def test_a_restore_from_the_changelog_gives_the_same_context(texts: list[str]) -> None:
    """A store restored from the changelog, tombstones too, reads the same context as the written one."""
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
        assert written.context(T, len(texts), 50) == restored.context(T, len(texts), 50)
        assert restored.run_of_message(T, "m-0") is None


# One step of a thread's life as the processor drives its history table: store the
# next message, rewrite a stored one (its run ended), erase the thread, read the
# context of a dispatch (before the newest message, or a retry's before the one
# stored last), commit, or roll back (the cache is cleared with the stores).
_PUT = st.tuples(st.just("put"), st.text(alphabet="ab✈", max_size=3))
_STEP = st.one_of(
    _PUT, _PUT, _PUT, st.tuples(st.just("read"), st.integers(0, 2)),
    st.tuples(st.just("rewrite"), st.integers(0, 30)),
    st.tuples(st.just("erase"), st.integers(0, 1)),  # 1: the thread starts again
    st.tuples(st.just("read"), st.integers(0, 2)),
    st.tuples(st.just("commit"), st.just(0)),
    st.tuples(st.just("rollback"), st.just(0)),
)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(steps=st.lists(_STEP, max_size=80), limit=st.integers(1, 3))
# A window read for a dispatch, then the context of a message two back: not the window's.
@hypothesis.example(steps=[("put", "a")] * 5 + [("read", 0), ("read", 2)], limit=2)
# A retry after its user message was stored: the window must still hold `limit` older ones.
@hypothesis.example(steps=[("put", "a")] * 5 + [("read", 0), ("put", "b"), ("read", 1)], limit=2)
def test_cached_context_is_what_the_store_holds(steps: list[tuple[str, object]], limit: int) -> None:
    """Whatever the order of puts, rewrites, erases, commits and rollbacks, a dispatch's
    context read through the windows equals the one read from the rows alone."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        db = PartitionStore(Path(folder) / "db")
        windows = ContextWindows(limit, max_chars=12)  # small: eviction happens too
        cached, plain = MessageStore(db, CODEC, windows, 0), MessageStore(db, CODEC)
        count = committed = 0
        for action, arg in steps:
            if action == "put":
                record, raw = _record(count, str(arg), "user" if count % 2 == 0 else "assistant")
                cached.put(T, record, raw)
                count += 1
            elif action == "rewrite" and count:
                stored = plain.record(T, int(str(arg)) % count)
                if stored is not None:  # its run ended; some also relinked (a rollback)
                    number = int(str(arg))
                    parent = None if number % 3 == 0 else number % (stored.seq + 1) - 1
                    record = MessageRecord(stored.seq, stored.message, RunStatus.COMPLETED, 2,
                                           parent)
                    cached.put(T, record, CODEC.encode_message(record, new_meta(T, "x", 1)))
            elif action == "erase":
                for seq in range(count):
                    cached.erase(T, seq)
                count = 0 if arg else count
            elif action == "read":
                before = max(0, count - int(str(arg)))
                assert cached.links(T, before, limit) == plain.links(T, before, limit)
            elif action == "commit":
                db.commit()
                committed = count
            elif action == "rollback":
                db.rollback()
                windows.clear()
                count = committed
        assert windows.chars == sum(len(m.text) for w in windows._windows.values()
                                    for m in (link.message for link in w.messages))


def test_a_parent_link_is_read_back_from_the_context_row_and_after_a_restore(
        tmp_path: Path) -> None:
    """A record with a parent of its own keeps it in its context row (the path a dispatch
    walks); one without reads as following the message before it, as before branches."""
    written = MessageStore(PartitionStore(tmp_path / "a"), CODEC)
    restored = MessageStore(PartitionStore(tmp_path / "b"), CODEC)
    for seq, parent in enumerate([None, None, None, 0, -1]):
        record, _ = _record(seq, f"text {seq}")
        record = replace(record, parent_seq=parent)
        raw = CODEC.encode_message(record, new_meta(T, "x", 1))
        written.put(T, record, raw)
        restored.restore(message_key(T, seq), raw, seq)
    for store in (written, restored):
        assert [(link.seq, link.parent_seq) for link in store.links(T, 5, 50)] == \
            [(4, -1), (3, 0), (2, None), (1, None), (0, None)]
        link = store.link(T, 3)
        assert link is not None and link.message == HistoryMessage("m-3", "user", "text 3")
        assert store.link(T, 9) is None


def test_a_regenerate_answer_is_indexed_by_its_run(tmp_path: Path) -> None:
    """An answer of another run than its question's own (a regenerate's) is indexed by run,
    restored so, and forgotten when erased; a question's own answer is not indexed."""
    regen = regenerate_run_id_for(T, "key")
    question, _ = _record(0, "question")
    own = MessageRecord(1, StoredMessage("a-1", "assistant", "answer", run_id_for(T, "m-0"), 1))
    again = MessageRecord(2, StoredMessage("a-2", "assistant", "again", regen, 2), parent_seq=0)
    written = MessageStore(PartitionStore(tmp_path / "a"), CODEC)
    restored = MessageStore(PartitionStore(tmp_path / "b"), CODEC)
    for record in (question, own, again):
        raw = CODEC.encode_message(record, new_meta(T, "x", 1))
        written.put(T, record, raw)
        restored.restore(message_key(T, record.seq), raw, record.seq)
    for store in (written, restored):
        assert store.answered(T, regen)
        assert not store.answered(T, run_id_for(T, "m-0"))
        assert store.seq_of_message(T, "m-0") == 0 and store.seq_of_message(T, "a-2") is None
    restored.restore(message_key(T, 2), None, 3)
    assert not restored.answered(T, regen)
