"""The processor's history table: a partition's stored messages, and which message
ids already ran.

Rows live in one `PartitionStore` per partition, restored from the messages topic
(its changelog) like the threads table is from the threads topic, so it only ever
holds committed history. Two kinds of row, both prefixed by the thread so one
thread's rows sort together:

    b"m" <thread> <seq, 8 bytes big-endian>  -> the messages-topic record (bytes)
    b"c" <thread> <seq, 8 bytes big-endian>  -> the same message as agent context
    b"i" <thread> <user message id>           -> its seq: the duplicate-post index

The context rows exist because every dispatch reads up to 50 earlier messages: as
`role, message id, text` behind a length they cost a slice and two UTF-8 decodes,
where decoding the whole Avro record cost about 15 µs a message (half the batch
time in the growth benchmark's profile).

`<thread>` is the UTF-8 thread id behind its 4-byte length, so no thread's prefix
is another's. The index is what replaced `ThreadState.run_by_message`: a known
message id never starts a second run, however old, without the state growing.
"""

from __future__ import annotations

from collections.abc import Iterator

from streams.history import parse_message_key
from streams.kafka.state_store import PartitionStore
from streams.records import HistoryMessage, MessageRecord
from streams.serialization import Codec, DecodeError
from streams.thread import run_id_for

__all__ = ["MessageStore"]


def _thread(thread_id: str) -> bytes:
    raw = thread_id.encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(4, "big") + raw


def _row(thread_id: str, seq: int) -> bytes:
    return b"m" + _thread(thread_id) + seq.to_bytes(8, "big")


def _index(thread_id: str, message_id: str) -> bytes:
    return b"i" + _thread(thread_id) + message_id.encode("utf-8", "surrogatepass")


def _context_row(thread_id: str, seq: int) -> bytes:
    return b"c" + _thread(thread_id) + seq.to_bytes(8, "big")


def _context_value(record: MessageRecord) -> bytes:
    message = record.message
    message_id = message.message_id.encode("utf-8", "surrogatepass")
    role = message.role.encode("utf-8", "surrogatepass")
    return (len(role).to_bytes(1, "big") + role + len(message_id).to_bytes(4, "big") + message_id
            + message.text.encode("utf-8", "surrogatepass"))


def _context(value: bytes) -> HistoryMessage:
    role_end = 1 + value[0]
    id_end = role_end + 4 + int.from_bytes(value[role_end:role_end + 4], "big")
    return HistoryMessage(value[role_end + 4:id_end].decode("utf-8", "surrogatepass"),
                          value[1:role_end].decode("utf-8", "surrogatepass"),
                          value[id_end:].decode("utf-8", "surrogatepass"))


class MessageStore:
    """A view of one partition's history table (staged writes included)."""

    def __init__(self, store: PartitionStore, codec: Codec) -> None:
        self.store = store
        self.codec = codec

    def record(self, thread_id: str, seq: int) -> MessageRecord | None:
        """Message `seq` of the thread, or None (never stored, or erased)."""
        raw = self.store.get(_row(thread_id, seq))
        if raw is None:
            return None
        return self.codec.decode_message(raw)[1]

    def raw(self, thread_id: str, seq: int) -> bytes | None:
        return self.store.get(_row(thread_id, seq))

    def run_of_message(self, thread_id: str, message_id: str) -> str | None:
        """The run an earlier post of `message_id` started on the thread, if any."""
        if self.store.get(_index(thread_id, message_id)) is None:
            return None
        return run_id_for(thread_id, message_id)

    def newest_first(self, thread_id: str, before_seq: int) -> Iterator[HistoryMessage]:
        """The thread's messages older than `before_seq` as agent context, newest first."""
        for seq in range(before_seq - 1, -1, -1):
            value = self.store.get(_context_row(thread_id, seq))
            if value is not None:
                yield _context(value)
                continue
            record = self.record(thread_id, seq)  # a row stored before context rows existed
            if record is not None:
                message = record.message
                yield HistoryMessage(message.message_id, message.role, message.text)

    def put(self, thread_id: str, record: MessageRecord, raw: bytes,
            changelog_offset: int | None = None) -> None:
        """Stage message `record.seq` (its messages-topic bytes `raw`)."""
        self.store.put(_row(thread_id, record.seq), raw, changelog_offset)
        self.store.put(_context_row(thread_id, record.seq), _context_value(record))
        if record.message.role == "user":
            self.store.put(_index(thread_id, record.message.message_id),
                           record.seq.to_bytes(8, "big"))

    def erase(self, thread_id: str, seq: int, changelog_offset: int | None = None) -> None:
        """Stage the removal of message `seq` and its index row."""
        row = _row(thread_id, seq)
        raw = self.store.get(row)
        if raw is not None:
            try:
                message = self.codec.decode_message(raw)[1].message
            except DecodeError:
                message = None
            if message is not None and message.role == "user":
                self.store.delete(_index(thread_id, message.message_id))
        self.store.delete(_context_row(thread_id, seq))
        self.store.delete(row, changelog_offset)

    def restore(self, key: bytes, value: bytes | None, offset: int) -> None:
        """Apply one messages-topic record read back from the changelog."""
        try:
            thread_id, seq = parse_message_key(key)
        except ValueError:
            self.store.note_offset(offset)  # not ours to keep; move past it
            return
        if value is None:
            self.erase(thread_id, seq, offset)
            return
        try:
            record = self.codec.decode_message(value)[1]
        except DecodeError:
            self.store.note_offset(offset)
            return
        self.put(thread_id, record, value, offset)
