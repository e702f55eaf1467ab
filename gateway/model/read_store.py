"""The gateway's local read store: one RocksDB (rocksdict) restored from the
`threads` and `messages` changelogs, with the offsets it reached per partition.

Nothing per thread or per message lives in Python memory: rows are read from
RocksDB per request (a point read, or a range scan of one page). Only the set of
active runs is kept in memory (the feed and per-tenant limits ask for it often);
it is also stored, so a warm start reads it without scanning the threads.

A batch of changelog records is applied as one RocksDB write batch that also
holds the offsets it reaches (like `streams.kafka.state_store` for the processor): a
crash leaves the store at a batch boundary, and a restart goes on from there.
Re-reading records after a checkpoint is harmless anyway (every row is the last
record's image, so applying a record twice gives the same rows).

Rows (keys are bytes; `len2(x)` is x's UTF-8 length as 2 bytes, then x):

    \\x00meta                        JSON: what the store was built from
    \\x01 kind partition(4)          changelog offset to read next (kind t|m)
    \\x02 partition(4)               when a split store let go of the partition (ms):
                                     rows kept past the tombstones' retention are stale
    T thread_id                      header (updated_at, tenant) + encoded ThreadState
    S len2(thread_id) seq(8)         len2(message_id) len2(run_id if user) + the encoded
                                     MessageRecord (the messages topic's value)
    N len2(thread_id) message_id     seq(8) of that message
    R run_id                         len2(thread_id) + seq(8) of the run's user message
    L len2(tenant) inv(8) thread_id  the tenant's threads, newest updated_at first
    A thread_id                      the thread's active run (tenant, run_id, accepted_at)
    P len2(thread_id) seq(8)         the message's parent seq (signed 8), only when its
                                     record names one (a branch's first message)
    G len2(thread_id) run_id         a regenerate's run (its R row points at the user
                                     message it answers again: from the state while it
                                     is active or queued, from its answer's parent once
                                     stored), so a delete finds it

Length prefixes make each thread's rows one contiguous key range whatever
characters the ids hold, so a page of messages is one seek and `limit` steps.
States and messages written before the messages topic existed (a ThreadState
that still carries `messages` and `runs`) are indexed as message rows too.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch

from streams.clock import now_ms
from streams.core.branches import parent_seq_of
from streams.core.domain import ActiveRun, RunRecord, RunStatus, StoredMessage, ThreadState
from streams.core.history import message_key, parse_message_key
from streams.core.ids import run_id_for
from streams.core.records import MessageRecord
from streams.wire import (
    Codec,
    DecodeError,
    new_meta,
)

__all__ = ["ActiveRunStart", "ActiveRuns", "Link", "MessagePage", "ReadStore", "RunRef", "ThreadPage",
           "listed_at"]

log = logging.getLogger("threadline.gateway")

FORMAT = 3  # 3: parent rows (P) and regenerate runs (G), issue #30
_META = b"\x00meta"
_CHECKPOINT = b"\x01"
_RELEASED = b"\x02"  # + partition(4): when a split store last let go of the partition (ms)
_THREAD, _MESSAGE, _BY_ID, _RUN, _LIST, _ACTIVE = b"T", b"S", b"N", b"R", b"L", b"A"
_PARENT, _REGENERATE = b"P", b"G"
_PARENT_SEQ = struct.Struct(">q")
_SEQ = struct.Struct(">Q")
_HEADER = struct.Struct(">qH")  # updated_at_ms, tenant length (then the tenant)
_INV = (1 << 63) - 1
THREADS, MESSAGES = "t", "m"  # changelog kinds in checkpoint keys

ActiveRunStart = tuple[str, str, int]  # thread_id, run_id, accepted at (ms)
ActiveEntry = tuple[str, str, int]  # tenant, run_id, accepted at (ms)


class ActiveRuns:
    """The active runs by thread (tenant, run id, accepted at), with each thread's
    partition and a count per partition and tenant kept as they change: a post asks
    its tenant's count over a gateway's share, which must not cost a pass over every
    active run (nor a murmur2 hash of each: 6 µs in Python)."""

    def __init__(self, partition_of: Callable[[str], int]) -> None:
        self._partition_of = partition_of
        self._entries: dict[str, ActiveEntry] = {}
        self._partition: dict[str, int] = {}
        self._counts: dict[int, dict[str, int]] = {}  # partition -> tenant -> runs

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, thread_id: object) -> bool:
        return thread_id in self._entries

    def get(self, thread_id: str) -> ActiveEntry | None:
        """The thread's active run, or None."""
        return self._entries.get(thread_id)

    def items(self) -> list[tuple[str, ActiveEntry]]:
        """Every (thread id, entry)."""
        return list(self._entries.items())

    def put(self, thread_id: str, entry: ActiveEntry) -> None:
        """Set the thread's active run."""
        self.pop(thread_id)
        partition = self._partition_of(thread_id)
        self._entries[thread_id] = entry
        self._partition[thread_id] = partition
        tenants = self._counts.setdefault(partition, {})
        tenants[entry[0]] = tenants.get(entry[0], 0) + 1

    def pop(self, thread_id: str) -> ActiveEntry | None:
        """Forget the thread's active run; the entry it had, or None."""
        entry = self._entries.pop(thread_id, None)
        if entry is None:
            return None
        partition = self._partition.pop(thread_id)
        tenants = self._counts[partition]
        left = tenants[entry[0]] - 1
        if left:
            tenants[entry[0]] = left
        else:
            del tenants[entry[0]]
            if not tenants:
                del self._counts[partition]
        return entry

    def clear(self) -> None:
        """Forget every active run."""
        self._entries.clear()
        self._partition.clear()
        self._counts.clear()

    def in_partitions(self, partitions: Collection[int] | None) -> list[tuple[str, ActiveEntry]]:
        """(thread id, entry) of the threads in `partitions` (None: all)."""
        if partitions is None:
            return self.items()
        where = self._partition
        return [(t, entry) for t, entry in self._entries.items() if where[t] in partitions]

    def count(self, tenant: str, partitions: Collection[int] | None) -> int:
        """The tenant's active runs in `partitions` (None: all)."""
        counts = self._counts
        chosen = counts.keys() if partitions is None else partitions
        return sum(counts[p].get(tenant, 0) for p in chosen if p in counts)

    def counts(self, partitions: Collection[int] | None) -> dict[str, int]:
        """Active runs in `partitions` (None: all), by tenant."""
        out: dict[str, int] = {}
        for partition, tenants in self._counts.items():
            if partitions is None or partition in partitions:
                for tenant, n in tenants.items():
                    out[tenant] = out.get(tenant, 0) + n
        return out


def _len2(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(2, "big") + raw


def _thread_prefix(tag: bytes, thread_id: str) -> bytes:
    return tag + _len2(thread_id)


def _listing_key(tenant: str, updated_at_ms: int, thread_id: str) -> bytes:
    return _LIST + _len2(tenant) + _SEQ.pack(_INV - max(0, updated_at_ms)) + \
        thread_id.encode("utf-8", "surrogatepass")


def _checkpoint_key(kind: str, partition: int) -> bytes:
    return _CHECKPOINT + kind.encode() + partition.to_bytes(4, "big")


def listed_at(state: ThreadState) -> int:
    """When the thread was last updated, as its listing orders it."""
    return state.updated_at_ms or state.created_at_ms


@dataclass(frozen=True, slots=True)
class RunRef:
    """Where a run's user message is stored."""

    thread_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class Link:
    """A stored message as far as the thread's tree goes (`streams.core.branches.Linked`)."""

    seq: int
    parent_seq: int | None


@dataclass(frozen=True, slots=True)
class MessagePage:
    """One page of a thread's messages, and whether more lie past it."""
    records: list[MessageRecord]
    more: bool  # further records exist past the page, in the direction read
    rows_read: int


@dataclass(frozen=True, slots=True)
class ThreadPage:
    """One page of thread states, and whether more lie past it."""
    states: list[ThreadState]
    more: bool
    # Display titles the gateways holding them gave (a gateway group's gathered page).
    titles: dict[str, str] = field(default_factory=dict)


class ReadStore:
    """Synchronous; the gateway's `ReadModel` feeds it from Kafka on its loop."""

    def __init__(self, path: Path, identity: dict[str, Any], *, codec: Codec,
                 block_cache_bytes: int = 32 << 20,
                 partition_of: Callable[[str], int] = lambda _: 0) -> None:
        self.path = path
        self.codec = codec  # the gateway's, from its settings
        # The wire header of states written with this build's schema: those carry no
        # legacy history, so they need no second decode.
        self._current_state = codec.state_header()
        self.identity = identity
        self.rows_read = 0  # message rows read by page queries (tests check the bound)
        # thread -> tenant, run, at; `partition_of` places each (a split read model)
        self.active = ActiveRuns(partition_of)
        self._pending: dict[bytes, bytes | None] = {}  # staged until commit()
        self._cache = Cache(block_cache_bytes)
        self._db = self._open()
        meta = self._db.get(_META)
        if meta is None or json.loads(meta).get("identity") != identity or \
                json.loads(meta).get("format") != FORMAT:
            if meta is not None:
                log.warning("read store %s was built for %s; starting it afresh", path,
                            json.loads(meta).get("identity"))
            self.wipe()
        self._load_active()

    def _open(self) -> Rdict:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        # Bounded memory whatever the data size: index and filter blocks live in the
        # block cache, and the memtables are small.
        table = BlockBasedOptions()
        table.set_block_cache(self._cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        table.set_bloom_filter(10, False)  # a restore asks for many rows that do not exist
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_size(16 << 20)
        opts.set_max_write_buffer_number(2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return Rdict(str(self.path), opts)

    def wipe(self) -> None:
        """Forget everything: the next restore starts from the beginning."""
        self._db.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._db = self._open()
        self._db.put(_META, json.dumps({"identity": self.identity, "format": FORMAT,
                                        "saved_at_ms": now_ms()}).encode())
        self.active.clear()
        self._pending.clear()

    def close(self) -> None:
        """Drop unwritten changes and close the database."""
        self._pending.clear()
        self._db.close()

    @property
    def saved_at_ms(self) -> int:
        """When a batch was last committed (0: never)."""
        meta = self._db.get(_META)
        return int(json.loads(meta).get("saved_at_ms", 0)) if meta is not None else 0

    def _load_active(self) -> None:
        self.active.clear()
        for key, value in self._scan(_ACTIVE):
            thread_id = key[1:].decode("utf-8", "surrogatepass")
            self.active.put(thread_id, _unpack_active(value))

    # --- checkpoints -------------------------------------------------------------

    def checkpoint(self, kind: str, partition: int) -> int | None:
        """The offset the store has reached in a topic kind's partition, or None if never read."""
        raw = self._db.get(_checkpoint_key(kind, partition))
        return int(raw) if raw is not None else None

    def commit(self, offsets: dict[tuple[str, int], int], *, touch: bool = False) -> None:
        """Write the staged rows and the offsets they reach in one batch (with `touch`,
        renew `saved_at_ms` even if nothing changed)."""
        if not self._pending and not offsets and not touch:
            return
        batch = WriteBatch(raw_mode=True)
        for key, value in self._pending.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        for (kind, partition), offset in offsets.items():
            batch.put(_checkpoint_key(kind, partition), str(offset).encode())
        batch.put(_META, json.dumps({"identity": self.identity, "format": FORMAT,
                                     "saved_at_ms": now_ms()}).encode())
        self._db.write(batch)
        self._pending.clear()

    # --- partitions of a split store (a gateway group) ----------------------------

    def released_at(self, partition: int) -> int | None:
        """When the store let go of the partition (ms), or None if it holds it or never did."""
        raw = self._db.get(_RELEASED + partition.to_bytes(4, "big"))
        return int(raw) if raw is not None else None

    def release(self, partition: int, at_ms: int) -> None:
        """Mark the partition let go of at `at_ms`: its rows and checkpoints stay, to go
        on from there if it comes back before the topics forget tombstones."""
        self._db.put(_RELEASED + partition.to_bytes(4, "big"), str(at_ms).encode())

    def retake(self, partition: int) -> None:
        """The partition is held again."""
        self._db.delete(_RELEASED + partition.to_bytes(4, "big"))

    def erase_partition(self, partition: int, in_partition: Callable[[str], bool]) -> int:
        """Delete every row of the threads `in_partition` selects and the partition's
        checkpoints: it is read again from the start. Returns the threads erased."""
        threads = {key[1:].decode("utf-8", "surrogatepass") for key, _ in self._scan(_THREAD)}
        for key, _ in self._scan(_MESSAGE):
            n = int.from_bytes(key[1:3], "big")
            threads.add(key[3:3 + n].decode("utf-8", "surrogatepass"))
        erased = sorted(t for t in threads if in_partition(t))
        for thread_id in erased:
            self.apply_state(thread_id.encode("utf-8", "surrogatepass"), None)
        for kind in (THREADS, MESSAGES):
            self._delete(_checkpoint_key(kind, partition))
        self.commit({})
        return len(erased)

    # --- staged access -----------------------------------------------------------

    def _get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        value: bytes | None = self._db.get(key)
        return value

    def _put(self, key: bytes, value: bytes) -> None:
        self._pending[key] = value

    def _delete(self, key: bytes) -> None:
        self._pending[key] = None

    def _scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Committed rows whose key starts with `prefix`, from `start` on, in key order."""
        it = self._db.iter()
        it.seek(start if start is not None else prefix)
        while it.valid():
            key: bytes = it.key()
            if not key.startswith(prefix):
                return
            yield key, it.value()
            it.next()

    def _keys_staged_and_stored(self, prefix: bytes) -> list[bytes]:
        keys = {k for k, _ in self._scan(prefix)}
        keys.update(k for k in self._pending if k.startswith(prefix))
        return sorted(k for k in keys if self._get(k) is not None)

    # --- applying changelog records ----------------------------------------------

    def apply_state(self, key: bytes, value: bytes | None) -> str | None:
        """Stage a `threads` record. Returns the thread id if it deletes the thread."""
        thread_id = key.decode("utf-8", "surrogatepass")
        old = self._get(_THREAD + key)
        if old is not None:
            updated, tenant = _unpack_header(old)
            self._delete(_listing_key(tenant, updated, thread_id))
        if value is None:
            if old is not None:
                self._delete(_THREAD + key)
            self._set_active(thread_id, None, None)
            self._erase_messages(thread_id)
            return thread_id
        messages: tuple[StoredMessage, ...] = ()
        runs: dict[str, RunRecord] = {}
        try:
            if value.startswith(self._current_state):
                # Its idempotency keys are the processor's (up to 256 records a
                # state): not read; the value is kept whole for the thread's reads.
                state = self.codec.decode_state_without_keys(value)
            else:  # an earlier form, written again below: read whole
                state = self.codec.decode_state(value)
                messages, runs = self.codec.decode_legacy_history(value)
        except DecodeError as exc:
            log.warning("skipping an undecodable thread state: %s", exc)
            return None
        if messages:  # written before the messages topic: index its history here
            state, value = self._index_legacy(state, messages, runs)
        header = _HEADER.pack(listed_at(state), len(state.tenant.encode("utf-8", "surrogatepass")))
        self._put(_THREAD + key, header + state.tenant.encode("utf-8", "surrogatepass") + value)
        self._put(_listing_key(state.tenant, listed_at(state), thread_id), b"")
        self._set_active(thread_id, state.tenant, state.active_run)
        self._index_regenerates(thread_id, state)
        return None

    def _index_regenerates(self, thread_id: str, state: ThreadState) -> None:
        """Index the runs of regenerates (active or queued): no record is keyed by
        them, so the R row points at the user message they answer again."""
        runs = [(q.run_id, q.message_id, q.seq) for q in state.queued if q.run_id is not None]
        run = state.active_run
        if run is not None and run.message_seq >= 0:
            runs.append((run.run_id, run.message_id, run.message_seq))
        for run_id, message_id, seq in runs:
            if run_id != run_id_for(thread_id, message_id):  # not the message's own run
                self._index_regenerate(thread_id, run_id, seq)

    def _set_active(self, thread_id: str, tenant: str | None, run: ActiveRun | None) -> None:
        key = _ACTIVE + thread_id.encode("utf-8", "surrogatepass")
        if run is None or tenant is None:
            if self.active.pop(thread_id) is not None:
                self._delete(key)
            return
        accepted = run.accepted_at_ms or run.attempt_started_ms
        entry = (tenant, run.run_id, accepted)
        if self.active.get(thread_id) != entry:
            self.active.put(thread_id, entry)
            self._put(key, _pack_active(entry))

    def _index_legacy(self, state: ThreadState, messages: tuple[Any, ...],
                      runs: dict[str, RunRecord]) -> tuple[ThreadState, bytes]:
        seq_of = {m.message_id: seq for seq, m in enumerate(messages)}
        meta = new_meta(state.thread_id, state.tenant, 0)
        for seq, message in enumerate(messages):
            run = runs.get(message.run_id) if message.role == "user" else None
            record = MessageRecord(seq, message, run.status if run else None,
                                   run.attempts if run else 0)
            self.apply_message(message_key(state.thread_id, seq), self.codec.encode_message(record, meta))
        active = state.active_run
        if active is not None and active.message_seq < 0 and active.message_id in seq_of:
            accepted = messages[seq_of[active.message_id]].created_at_ms
            active = replace(active, message_seq=seq_of[active.message_id],
                             accepted_at_ms=active.accepted_at_ms or accepted)
        ended = [r for r in runs.values() if r.status.is_terminal]
        state = replace(state, active_run=active,
                        message_count=max(state.message_count, len(messages)),
                        run_count=max(state.run_count, len(runs)),
                        last_run=state.last_run or (ended[-1] if ended else None),
                        updated_at_ms=state.updated_at_ms or max(
                            state.created_at_ms, messages[-1].created_at_ms))
        return state, self.codec.encode_state(state)

    def apply_message(self, key: bytes, value: bytes | None) -> None:
        """Stage a `messages` record."""
        try:
            thread_id, seq = parse_message_key(key)
        except ValueError as exc:
            log.warning("skipping a message record: %s", exc)
            return
        row = _thread_prefix(_MESSAGE, thread_id) + _SEQ.pack(seq)
        old = self._get(row)
        old_header = None if old is None else old[:_header_size(old)]
        parent_row = _thread_prefix(_PARENT, thread_id) + _SEQ.pack(seq)
        if value is None:
            if old is not None:
                self._unindex(thread_id, old)
                self._delete(row)
            if self._get(parent_row) is not None:
                self._delete(parent_row)
            return
        try:
            _, record = self.codec.decode_message(value)
        except DecodeError as exc:
            log.warning("skipping an undecodable message record: %s", exc)
            return
        if record.parent_seq is not None:
            self._put(parent_row, _PARENT_SEQ.pack(record.parent_seq))
        elif self._get(parent_row) is not None:
            self._delete(parent_row)
        message = record.message
        header = _len2(message.message_id) + \
            _len2(message.run_id if message.role == "user" else "")
        self._put(row, header + value)
        # A user message is rewritten when its run ends: same ids, nothing to reindex
        # (and the old row's ids are in its header, so it is never decoded again).
        if old_header == header:
            return
        if old is not None:
            self._unindex(thread_id, old)
        self._put(_thread_prefix(_BY_ID, thread_id) + message.message_id.encode(
            "utf-8", "surrogatepass"), _SEQ.pack(seq))
        if message.role == "user" and message.run_id:
            self._put(_RUN + message.run_id.encode("utf-8", "surrogatepass"),
                      _len2(thread_id) + _SEQ.pack(seq))
        elif message.role == "assistant" and message.run_id:
            # A regenerate's answer follows the question it answers again: its run is
            # indexed there even if no state that showed it active was read (compacted).
            self._index_regenerate(thread_id, message.run_id, parent_seq_of(record))

    def _index_regenerate(self, thread_id: str, run_id: str, seq: int) -> None:
        """Point a regenerate's run at its question (once: a user message's own run is
        indexed by its record already, and keeps that)."""
        key = _RUN + run_id.encode("utf-8", "surrogatepass")
        if self._get(key) is None and seq >= 0:
            self._put(_thread_prefix(_REGENERATE, thread_id) +
                      run_id.encode("utf-8", "surrogatepass"), b"")
            self._put(key, _len2(thread_id) + _SEQ.pack(seq))

    def _unindex(self, thread_id: str, row: bytes) -> None:
        message_id, run_id = _row_ids(row)
        self._delete(_thread_prefix(_BY_ID, thread_id) + message_id)
        if run_id:
            self._delete(_RUN + run_id)

    def _erase_messages(self, thread_id: str) -> None:
        """A deleted thread: every message row and its index entries (the messages
        topic's tombstones do the same when they are read)."""
        for row in self._keys_staged_and_stored(_thread_prefix(_MESSAGE, thread_id)):
            stored = self._get(row)
            if stored is not None:
                self._unindex(thread_id, stored)
            self._delete(row)
        for row in self._keys_staged_and_stored(_thread_prefix(_PARENT, thread_id)):
            self._delete(row)
        prefix = _thread_prefix(_REGENERATE, thread_id)
        for mark in self._keys_staged_and_stored(prefix):
            self._delete(mark)
            self._delete(_RUN + mark[len(prefix):])

    # --- reads ---------------------------------------------------------------------

    def state(self, thread_id: str) -> ThreadState | None:
        """A thread's stored state, or None if unknown or unreadable."""
        row = self._db.get(_THREAD + thread_id.encode("utf-8", "surrogatepass"))
        if row is None:
            return None
        _, tenant_len = _HEADER.unpack_from(row)
        try:
            return self.codec.decode_state(row[_HEADER.size + tenant_len:])
        except DecodeError as exc:
            log.warning("unreadable stored state of %s: %s", thread_id, exc)
            return None

    def run(self, run_id: str) -> RunRef | None:
        """The thread, and the seq of the message, that a run id belongs to, or None."""
        raw = self._db.get(_RUN + run_id.encode("utf-8", "surrogatepass"))
        if raw is None:
            return None
        n = int.from_bytes(raw[:2], "big")
        return RunRef(raw[2:2 + n].decode("utf-8", "surrogatepass"), _SEQ.unpack(raw[2 + n:])[0])

    def message(self, thread_id: str, seq: int) -> MessageRecord | None:
        """The message at this sequence number of a thread, or None."""
        raw = self._db.get(_thread_prefix(_MESSAGE, thread_id) + _SEQ.pack(seq))
        return None if raw is None else self.codec.decode_message(raw[_header_size(raw):])[1]

    def link(self, thread_id: str, seq: int) -> Link | None:
        """The message at `seq` as a node of the thread's tree (two point reads, no
        decode), or None if no record is stored there."""
        if self._db.get(_thread_prefix(_MESSAGE, thread_id) + _SEQ.pack(seq)) is None:
            return None
        raw = self._db.get(_thread_prefix(_PARENT, thread_id) + _SEQ.pack(seq))
        return Link(seq, None if raw is None else int(_PARENT_SEQ.unpack(raw)[0]))

    def messages_at(self, thread_id: str, seqs: list[int]) -> list[MessageRecord]:
        """The stored records at these seqs, in their order (missing ones left out)."""
        self.rows_read += len(seqs)
        return [r for r in (self.message(thread_id, s) for s in seqs) if r is not None]

    def message_seq(self, thread_id: str, message_id: str) -> int | None:
        """The sequence number of a thread's message with this id, or None."""
        raw = self._db.get(_thread_prefix(_BY_ID, thread_id) +
                           message_id.encode("utf-8", "surrogatepass"))
        return None if raw is None else int(_SEQ.unpack(raw)[0])

    def messages(self, thread_id: str, *, after: int | None = None, before: int | None = None,
                 limit: int = 100) -> MessagePage:
        """Up to `limit` messages, oldest first: the first ones after `after` (or from
        the start), or with only `before`, the last ones before it."""
        prefix = _thread_prefix(_MESSAGE, thread_id)
        rows: list[bytes] = []
        read = 0
        it = self._db.iter()
        if before is not None and after is None:
            if before <= 0:
                return MessagePage([], False, 0)
            it.seek_for_prev(prefix + _SEQ.pack(before - 1))
            while it.valid() and len(rows) <= limit:
                key: bytes = it.key()
                if not key.startswith(prefix) or len(key) != len(prefix) + 8:
                    break
                read += 1
                rows.append(it.value())
                it.prev()
            more = len(rows) > limit
            rows = rows[:limit]
            rows.reverse()
        else:
            it.seek(prefix + _SEQ.pack(0 if after is None else after + 1))
            while it.valid() and len(rows) <= limit:
                key = it.key()
                if not key.startswith(prefix) or len(key) != len(prefix) + 8:
                    break
                if before is not None and _SEQ.unpack(key[-8:])[0] >= before:
                    break
                read += 1
                rows.append(it.value())
                it.next()
            more = len(rows) > limit
            rows = rows[:limit]
        self.rows_read += read
        return MessagePage([self.codec.decode_message(r[_header_size(r):])[1] for r in rows], more, read)

    def threads(self, tenant: str, *, after: tuple[int, str] | None = None,
                limit: int = 50, only: Callable[[str], bool] | None = None) -> ThreadPage:
        """The tenant's threads, most recently updated first, after the cursor
        (updated_at_ms, thread_id) of the last one of the previous page; with `only`,
        those of the threads it selects."""
        prefix = _LIST + _len2(tenant)
        start = None if after is None else _listing_key(tenant, after[0], after[1])
        states: list[ThreadState] = []
        for key, _ in self._scan(prefix, start):
            if key == start:
                continue
            thread_id = key[len(prefix) + 8:].decode("utf-8", "surrogatepass")
            if only is not None and not only(thread_id):
                continue
            if len(states) == limit:
                return ThreadPage(states, True)
            state = self.state(thread_id)
            if state is not None:
                states.append(state)
        return ThreadPage(states, False)

    def active_runs(self) -> list[ActiveRunStart]:
        """Every active run as (thread id, run id, accepted at ms)."""
        return [(t, run, at) for t, (_, run, at) in self.active.items()]

    def memory(self) -> dict[str, int]:
        """RocksDB's memory: memtables and block cache (both capped at open)."""
        memtables: int | None = self._db.property_int_value("rocksdb.cur-size-all-mem-tables")
        return {"memtables_bytes": memtables or 0, "block_cache_bytes": self._cache.get_usage()}


def _header_size(row: bytes) -> int:
    """The length of a message row's header (its ids), before the encoded record."""
    n = int.from_bytes(row[:2], "big")
    return 4 + n + int.from_bytes(row[2 + n:4 + n], "big")


def _row_ids(row: bytes) -> tuple[bytes, bytes]:
    """A message row's message id and (user messages) run id, UTF-8."""
    n = int.from_bytes(row[:2], "big")
    m = int.from_bytes(row[2 + n:4 + n], "big")
    return row[2:2 + n], row[4 + n:4 + n + m]


def _unpack_header(row: bytes) -> tuple[int, str]:
    updated, n = _HEADER.unpack_from(row)
    return updated, row[_HEADER.size:_HEADER.size + n].decode("utf-8", "surrogatepass")


def _pack_active(entry: tuple[str, str, int]) -> bytes:
    return json.dumps(list(entry)).encode()


def _unpack_active(raw: bytes) -> tuple[str, str, int]:
    tenant, run_id, at = json.loads(raw)
    return str(tenant), str(run_id), int(at)


def run_status(state: ThreadState, run_id: str, record: MessageRecord | None) -> RunStatus | None:
    """A run's status as this gateway knows it: the state's active or last run, else
    what its user message's record says."""
    if state.active_run is not None and state.active_run.run_id == run_id:
        return state.active_run.status
    if state.last_run is not None and state.last_run.run_id == run_id:
        return state.last_run.status
    return None if record is None else record.run_status
