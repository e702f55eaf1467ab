"""The gateway's local read store on its own (no broker): pages are range scans that
read only their rows, listings are newest first, deletes leave nothing, states in
the old form (history inline) are indexed, and a reopened store keeps its
checkpoints and active runs."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro

from gateway.model.read_store import MESSAGES, THREADS, ReadStore
from streams.core.domain import ActiveRun, RunRecord, RunStatus, StoredMessage, ThreadState
from streams.core.history import message_key
from streams.core.records import MessageRecord
from streams.wire import SCHEMA_DIR, Codec, new_meta, schema_fingerprint

CODEC = Codec()  # single-object records, as the roles write them without a registry

IDENTITY = {"topic_prefix": "x.", "partitions": 4}


def _store(tmp_path: Path) -> ReadStore:
    return ReadStore(tmp_path / "store", IDENTITY, codec=Codec())


def _state(thread_id: str, tenant: str = "ten", updated: int = 1_000, count: int = 0,
           active: ActiveRun | None = None) -> bytes:
    return CODEC.encode_state(ThreadState(thread_id, tenant, f"title {thread_id}", 500,
                                    active_run=active, message_count=count,
                                    updated_at_ms=updated))


def _message(thread_id: str, seq: int, tenant: str = "ten") -> tuple[bytes, bytes]:
    user = seq % 2 == 0
    run_id = f"{thread_id}-run-{seq // 2}"
    message = StoredMessage(f"{thread_id}-m{seq}", "user" if user else "assistant",
                            f"text {seq}", run_id, 1_000 + seq)
    record = MessageRecord(seq, message, RunStatus.COMPLETED if user else None, 1 if user else 0)
    return message_key(thread_id, seq), CODEC.encode_message(record, new_meta(thread_id, tenant, 0))


def _fill(store: ReadStore, thread_id: str, n: int) -> None:
    store.apply_state(thread_id.encode(), _state(thread_id, count=n))
    for seq in range(n):
        store.apply_message(*_message(thread_id, seq))
    store.commit({(THREADS, 0): 1, (MESSAGES, 0): n})


def test_pages_are_range_scans_that_read_only_their_rows(tmp_path: Path) -> None:
    """Message pages are range scans that read only their rows, even next to a longer thread id."""
    store = _store(tmp_path)
    _fill(store, "a", 250)
    _fill(store, "a/0", 3)  # a thread id that extends another one: rows do not mix
    before = store.rows_read
    page = store.messages("a", limit=100)
    assert [r.seq for r in page.records] == list(range(100)) and page.more
    assert page.rows_read == 101 and store.rows_read - before == 101
    page = store.messages("a", after=199, limit=100)
    assert [r.seq for r in page.records] == list(range(200, 250)) and not page.more
    assert page.rows_read == 50
    page = store.messages("a", before=250, limit=30)  # the newest 30, oldest first
    assert [r.seq for r in page.records] == list(range(220, 250)) and page.more
    page = store.messages("a", before=10, limit=30)
    assert [r.seq for r in page.records] == list(range(10)) and not page.more
    page = store.messages("a", after=9, before=13, limit=30)
    assert [r.seq for r in page.records] == [10, 11, 12] and not page.more
    assert [r.message.text for r in store.messages("a/0").records] == \
        ["text 0", "text 1", "text 2"]
    assert store.messages("nope").records == []
    assert store.run("a-run-3") is not None and store.run("a-run-3").seq == 6  # type: ignore[union-attr]
    assert store.message_seq("a", "a-m7") == 7 and store.message_seq("a/0", "a-m7") is None


def test_a_rewritten_message_keeps_its_indexes_and_another_one_replaces_them(
        tmp_path: Path) -> None:
    """Rewriting a message keeps its run and id indexes; a different message at its seq replaces them."""
    store = _store(tmp_path)
    _fill(store, "a", 2)
    key, _ = _message("a", 0)
    user = StoredMessage("a-m0", "user", "text 0", "a-run-0", 1_000)
    meta = new_meta("a", "ten", 0)
    store.apply_message(key, CODEC.encode_message(MessageRecord(0, user, RunStatus.FAILED, 2), meta))
    store.commit({})
    record = store.message("a", 0)
    assert record is not None and (record.run_status, record.run_attempts) == \
        (RunStatus.FAILED, 2)
    assert store.run("a-run-0") is not None and store.message_seq("a", "a-m0") == 0
    other = StoredMessage("b-m0", "user", "other", "b-run", 1_000)
    store.apply_message(key, CODEC.encode_message(MessageRecord(0, other, RunStatus.DISPATCHED), meta))
    store.commit({})
    assert store.run("a-run-0") is None and store.message_seq("a", "a-m0") is None
    assert store.run("b-run") is not None and store.message_seq("a", "b-m0") == 0


def test_threads_list_newest_first_per_tenant_with_a_cursor(tmp_path: Path) -> None:
    """Threads list per tenant, newest first, by cursor; an update moves a thread to the front."""
    store = _store(tmp_path)
    for i in range(5):
        store.apply_state(f"t{i}".encode(), _state(f"t{i}", updated=1_000 + i))
    store.apply_state(b"other", _state("other", tenant="else", updated=9_999))
    store.commit({})
    page = store.threads("ten", limit=2)
    assert [s.thread_id for s in page.states] == ["t4", "t3"] and page.more
    page = store.threads("ten", after=(1_003, "t3"), limit=2)
    assert [s.thread_id for s in page.states] == ["t2", "t1"] and page.more
    page = store.threads("ten", after=(1_001, "t1"), limit=2)
    assert [s.thread_id for s in page.states] == ["t0"] and not page.more
    # An update moves the thread to the front and leaves no stale entry behind.
    store.apply_state(b"t0", _state("t0", updated=5_000))
    store.commit({})
    assert [s.thread_id for s in store.threads("ten").states] == ["t0", "t4", "t3", "t2", "t1"]
    assert [s.thread_id for s in store.threads("else").states] == ["other"]


def test_a_tombstone_erases_the_thread_its_messages_and_indexes(tmp_path: Path) -> None:
    """A thread tombstone erases its state, messages, indexes and active run in one batch."""
    store = _store(tmp_path)
    run = ActiveRun("a-run-1", "a-m2", 1, RunStatus.RUNNING, 5, 5, None, 2, 1_002)
    _fill(store, "a", 4)
    store.apply_state(b"a", _state("a", count=4, active=run))
    store.commit({})
    assert store.active_runs() == [("a", "a-run-1", 1_002)]
    assert store.apply_state(b"a", None) == "a"  # staged: deleted in the same batch
    store.commit({(THREADS, 0): 9})
    assert store.state("a") is None and store.messages("a").records == []
    assert store.run("a-run-0") is None and store.message_seq("a", "a-m1") is None
    assert store.threads("ten").states == [] and store.active_runs() == []
    # The messages topic's own tombstones come after: nothing left to do.
    for seq in range(4):
        store.apply_message(message_key("a", seq), None)
    store.commit({(MESSAGES, 0): 20})
    assert store.messages("a").records == []


def test_reopened_store_keeps_checkpoints_and_active_runs_and_refuses_other_topics(
        tmp_path: Path) -> None:
    """A reopened store keeps checkpoints and active runs; another prefix starts it empty."""
    store = _store(tmp_path)
    run = ActiveRun("r", "m", 1, RunStatus.DISPATCHED, 5, 5, None, 0, 77)
    store.apply_state(b"a", _state("a", active=run))
    store.commit({(THREADS, 2): 41, (MESSAGES, 3): 7})
    store.close()
    again = _store(tmp_path)
    assert again.checkpoint(THREADS, 2) == 41 and again.checkpoint(MESSAGES, 3) == 7
    assert again.checkpoint(THREADS, 0) is None
    assert again.active_runs() == [("a", "r", 77)] and again.state("a") is not None
    again.close()
    other = ReadStore(tmp_path / "store", {**IDENTITY, "topic_prefix": "y."}, codec=Codec())
    assert other.checkpoint(THREADS, 2) is None and other.state("a") is None
    assert other.active_runs() == []
    other.close()


def test_a_state_in_the_old_form_is_indexed_with_its_history(tmp_path: Path) -> None:
    """A state in the old form, history inside, is stored with its messages indexed."""
    old: dict[str, Any] = {
        "thread_id": "old", "tenant": "ten", "title": "t", "created_at_ms": 1,
        "messages": [
            {"message_id": "m1", "role": "user", "text": "Hi", "run_id": "r1",
             "created_at_ms": 2, "steps": [], "citations": []},
            {"message_id": "a1", "role": "assistant", "text": "Hello", "run_id": "r1",
             "created_at_ms": 3, "steps": [], "citations": []},
            {"message_id": "m2", "role": "user", "text": "Again", "run_id": "r2",
             "created_at_ms": 4, "steps": [], "citations": []},
        ],
        "active_run": {"run_id": "r2", "message_id": "m2", "attempt": 1, "status": "running",
                       "attempt_started_ms": 5, "last_heartbeat_ms": 5, "retry_due_ms": None},
        "runs": {"r1": {"run_id": "r1", "message_id": "m1", "status": "completed",
                        "attempts": 1},
                 "r2": {"run_id": "r2", "message_id": "m2", "status": "running",
                        "attempts": 1}},
        "run_by_message": {"m1": "r1", "m2": "r2"},
        "idempotency": {},
    }
    path = next((SCHEMA_DIR / "history").glob("threadline.ThreadState-*.avsc"))
    parsed = fastavro.parse_schema(json.loads(path.read_text()))
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, old)
    store = _store(tmp_path)
    store.apply_state(b"old", b"\xc3\x01" + schema_fingerprint(parsed) + out.getvalue())
    store.commit({})
    state = store.state("old")
    assert state is not None and state.message_count == 3 and state.run_count == 2
    assert state.last_run == RunRecord("r1", "m1", RunStatus.COMPLETED, 1)
    assert state.active_run is not None and state.active_run.message_seq == 2
    assert store.active_runs() == [("old", "r2", 4)]  # accepted when m2 was stored
    page = store.messages("old")
    assert [(r.seq, r.message.text, r.run_status) for r in page.records] == [
        (0, "Hi", RunStatus.COMPLETED), (1, "Hello", None), (2, "Again", RunStatus.RUNNING)]
    assert store.run("r2") is not None and store.message_seq("old", "a1") == 1


def test_a_split_store_erases_one_partitions_threads_and_lists_only_what_is_asked(
        tmp_path: Path) -> None:
    """A gateway group's store: the listing can be limited to the threads of the
    partitions held; erasing a partition (let go of past the tombstones' retention)
    deletes its threads' every row and its checkpoints, and nothing of the others;
    the mark of when a partition was let go of survives a reopen."""
    store = _store(tmp_path)
    for thread_id in ("p0-a", "p0-b", "p1-a"):
        _fill(store, thread_id, 4)
    store.commit({(THREADS, 1): 7, (MESSAGES, 1): 9})
    partition = {"p0-a": 0, "p0-b": 0, "p1-a": 1}.__getitem__
    listed = store.threads("ten", limit=10, only=lambda t: partition(t) == 1)
    assert [s.thread_id for s in listed.states] == ["p1-a"] and not listed.more
    store.release(0, 1234)
    assert store.released_at(0) == 1234 and store.released_at(1) is None
    assert store.erase_partition(0, lambda t: partition(t) == 0) == 2
    for gone in ("p0-a", "p0-b"):
        assert store.state(gone) is None and store.messages(gone).records == []
        assert store.message_seq(gone, f"{gone}-m0") is None and store.run(f"{gone}-run-0") is None
    assert store.checkpoint(THREADS, 0) is None and store.checkpoint(MESSAGES, 0) is None
    assert store.state("p1-a") is not None and len(store.messages("p1-a").records) == 4
    assert store.checkpoint(THREADS, 1) == 7
    assert [s.thread_id for s in store.threads("ten", limit=10).states] == ["p1-a"]
    store.close()
    reopened = _store(tmp_path)
    assert reopened.released_at(0) == 1234
    reopened.retake(0)
    assert reopened.released_at(0) is None
