"""The processor's history table: a partition's stored messages, and which message
ids already ran.

Rows live in one `PartitionStore` per partition, restored from the messages topic
(its changelog) like the threads table is from the threads topic, so it only ever
holds committed history. Four kinds of row, each prefixed by the thread so one
thread's rows sort together:

    b"m" <thread> <seq, 8 bytes big-endian>  -> the messages-topic record (bytes)
    b"c" <thread> <seq, 8 bytes big-endian>  -> the same message as agent context
                                                (and its parent, if not seq - 1)
    b"i" <thread> <user message id>           -> its seq: the duplicate-post index
    b"r" <thread> <run id>                    -> the seq of an answer that is not its
                                                parent question's own (a regenerate's)

The `r` rows let a regenerate's key answer once past its idempotency window: its
run id is named by the key (`ids.regenerate_run_id_for`), and a stored answer of that
run makes a repeat a duplicate (`Known.message_run_id`). An answer whose parent is the
user message it answers, by that message's own run, gets no row (every answer on a
thread that never branched, but for queued and interrupted runs' answers); one whose
parent row is not (yet) there when it is restored gets one: a row too many is never
read as anything but the run it names. A regenerate's run that ended with no answer
stored (failed, or cancelled before any partial answer) leaves no row: past the
window its key would start that run again (a limit; the messages topic holds no
record of it).

The context rows exist because every dispatch reads up to 50 earlier messages: as
`role, message id, text` behind a length they cost a slice and two UTF-8 decodes,
where decoding the whole Avro record cost about 15 µs a message (half the batch
time in the growth benchmark's profile).

`<thread>` is the UTF-8 thread id behind its 4-byte length, so no thread's prefix
is another's. The index is what replaced `ThreadState.run_by_message`: a known
message id never starts a second run, however old, without the state growing.

`ContextWindows` keeps recently active threads' newest context decoded in memory,
so that a dispatch at turn 1,000 (a full window of 50 messages) costs what one at
turn 10 does instead of 50 row reads and decodes; each entry keeps its parent link,
so a dispatch walks its branch's path through the window (`ContextLink`). It holds staged rows, so the
processor clears it whenever it rolls its stores back or loses a partition.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice

from streams.core.branches import parent_seq_of
from streams.core.history import parse_message_key
from streams.core.ids import run_id_for
from streams.core.records import HistoryMessage, MessageRecord
from streams.kafka.state_store import PartitionStore
from streams.wire import Codec, DecodeError

__all__ = ["ContextLink", "ContextWindows", "MessageStore"]


def _thread(thread_id: str) -> bytes:
    raw = thread_id.encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(4, "big") + raw


def _row(thread_id: str, seq: int) -> bytes:
    return b"m" + _thread(thread_id) + seq.to_bytes(8, "big")


def _index(thread_id: str, message_id: str) -> bytes:
    return b"i" + _thread(thread_id) + message_id.encode("utf-8", "surrogatepass")


def _answer_index(thread_id: str, run_id: str) -> bytes:
    return b"r" + _thread(thread_id) + run_id.encode("utf-8", "surrogatepass")


def _context_row(thread_id: str, seq: int) -> bytes:
    return b"c" + _thread(thread_id) + seq.to_bytes(8, "big")


# A context row of a message with a parent of its own starts with this byte and the
# parent (8 bytes, signed); any other row starts with its role's length (4 or 9), as
# every row written before branches does.
_LINKED = 0xFE


@dataclass(frozen=True, slots=True)
class ContextLink:
    """A stored message as agent context, with its place in the thread's tree
    (a `streams.core.branches.Linked`)."""

    seq: int
    parent_seq: int | None  # None: the message before it
    message: HistoryMessage


def _context_value(record: MessageRecord) -> bytes:
    message = record.message
    message_id = message.message_id.encode("utf-8", "surrogatepass")
    role = message.role.encode("utf-8", "surrogatepass")
    linked = b"" if record.parent_seq is None else \
        bytes([_LINKED]) + record.parent_seq.to_bytes(8, "big", signed=True)
    return (linked + len(role).to_bytes(1, "big") + role + len(message_id).to_bytes(4, "big")
            + message_id + message.text.encode("utf-8", "surrogatepass"))


def _context(seq: int, value: bytes) -> ContextLink:
    parent = None
    if value[0] == _LINKED:
        parent, value = int.from_bytes(value[1:9], "big", signed=True), value[9:]
    role_end = 1 + value[0]
    id_end = role_end + 4 + int.from_bytes(value[role_end:role_end + 4], "big")
    return ContextLink(seq, parent, HistoryMessage(
        value[role_end + 4:id_end].decode("utf-8", "surrogatepass"),
        value[1:role_end].decode("utf-8", "surrogatepass"),
        value[id_end:].decode("utf-8", "surrogatepass")))


def _link(record: MessageRecord) -> ContextLink:
    message = record.message
    return ContextLink(record.seq, record.parent_seq,
                       HistoryMessage(message.message_id, message.role, message.text))


@dataclass(slots=True)
class _Window:
    next_seq: int  # the window holds every message older than this (up to its size)
    messages: deque[ContextLink] = field(default_factory=deque)  # oldest first
    chars: int = 0


class ContextWindows:
    """The newest `size` messages of recently active threads, decoded, least recently
    used first out once they hold more than `max_chars` characters in all."""

    def __init__(self, size: int, max_chars: int = 8 << 20) -> None:
        # One more than a dispatch takes: a retry's dispatch reads the context before
        # its own user message, which the window already holds.
        self.size = size + 1
        self.max_chars = max_chars
        self.chars = 0
        self.hits = 0
        self.misses = 0
        self._windows: OrderedDict[tuple[int, str], _Window] = OrderedDict()

    def newest_first(self, partition: int, thread_id: str,
                     before_seq: int) -> list[ContextLink] | None:
        """The cached context older than `before_seq`, newest first; None if not cached."""
        window = self._windows.get((partition, thread_id))
        if window is None or not before_seq <= window.next_seq <= before_seq + 1:
            self.misses += 1
            return None
        self._windows.move_to_end((partition, thread_id))
        self.hits += 1
        return [link for link in reversed(window.messages) if link.seq < before_seq]

    def fill(self, partition: int, thread_id: str, next_seq: int,
             newest_first: list[ContextLink]) -> None:
        """Cache the thread's newest messages older than `next_seq`, read from the store."""
        self.drop(partition, thread_id)
        window = _Window(next_seq)
        for link in reversed(newest_first[: self.size]):
            window.messages.append(link)
            window.chars += len(link.message.text)
        self._windows[(partition, thread_id)] = window
        self.chars += window.chars
        self._evict()

    def stored(self, partition: int, thread_id: str, link: ContextLink) -> None:
        """Message `link.seq` was staged: extend the thread's window if it ends just before."""
        window = self._windows.get((partition, thread_id))
        if window is None:
            return
        if link.seq != window.next_seq:
            if link.seq > window.next_seq or any(old.seq == link.seq and old != link
                                                 for old in window.messages):
                self.drop(partition, thread_id)  # a gap or a changed row: read it again
            return  # a user message rewritten with its run's status: same context
        window.messages.append(link)
        window.next_seq = link.seq + 1
        window.chars += len(link.message.text)
        self.chars += len(link.message.text)
        while len(window.messages) > self.size:
            old = window.messages.popleft()
            window.chars -= len(old.message.text)
            self.chars -= len(old.message.text)
        self._evict()

    def drop(self, partition: int, thread_id: str) -> None:
        """Forget the thread's window (its history was erased or is unknown)."""
        window = self._windows.pop((partition, thread_id), None)
        if window is not None:
            self.chars -= window.chars

    def clear(self) -> None:
        """Forget everything: the stores were rolled back or partitions moved."""
        self._windows.clear()
        self.chars = 0

    def __len__(self) -> int:
        return len(self._windows)

    def _evict(self) -> None:
        while self.chars > self.max_chars and len(self._windows) > 1:
            _, window = self._windows.popitem(last=False)
            self.chars -= window.chars


class MessageStore:
    """A view of one partition's history table (staged writes included)."""

    def __init__(self, store: PartitionStore, codec: Codec,
                 windows: ContextWindows | None = None, partition: int = -1) -> None:
        self.store = store
        self.codec = codec
        self.windows = windows
        self.partition = partition

    def record(self, thread_id: str, seq: int) -> MessageRecord | None:
        """Message `seq` of the thread, or None (never stored, or erased)."""
        raw = self.store.get(_row(thread_id, seq))
        if raw is None:
            return None
        return self.codec.decode_message(raw)[1]

    def raw(self, thread_id: str, seq: int) -> bytes | None:
        """The stored bytes of a thread's message at this sequence number, undecoded, or None."""
        return self.store.get(_row(thread_id, seq))

    def run_of_message(self, thread_id: str, message_id: str) -> str | None:
        """The run an earlier post of `message_id` started on the thread, if any."""
        if self.store.get(_index(thread_id, message_id)) is None:
            return None
        return run_id_for(thread_id, message_id)

    def seq_of_message(self, thread_id: str, message_id: str) -> int | None:
        """The seq of the stored user message `message_id`, if the thread has it."""
        value = self.store.get(_index(thread_id, message_id))
        return None if value is None else int.from_bytes(value, "big")

    def answered(self, thread_id: str, run_id: str) -> bool:
        """Whether an answer of `run_id` that is not its question's own run's is stored
        (a regenerate's: see the module docstring)."""
        return self.store.get(_answer_index(thread_id, run_id)) is not None

    def link(self, thread_id: str, seq: int) -> ContextLink | None:
        """Message `seq` as context, with its parent; None if it is not stored."""
        value = self.store.get(_context_row(thread_id, seq))
        if value is not None:
            return _context(seq, value)
        record = self.record(thread_id, seq)  # a row stored before context rows existed
        return None if record is None else _link(record)

    def context(self, thread_id: str, before_seq: int, limit: int) -> list[HistoryMessage]:
        """At most `limit` of the newest messages older than `before_seq`, as agent
        context, newest first (by seq, whatever their branch)."""
        return [link.message for link in self.links(thread_id, before_seq, limit)]

    def links(self, thread_id: str, before_seq: int, limit: int) -> list[ContextLink]:
        """At most `limit` of the newest messages older than `before_seq`, newest first:
        every stored message between the last of them and `before_seq` is there."""
        windows = self.windows
        if windows is None or limit >= windows.size:
            return list(islice(self._read_newest_first(thread_id, before_seq), limit))
        cached = windows.newest_first(self.partition, thread_id, before_seq)
        if cached is None:
            # From `before_seq` itself: a retry's user message is stored already, and a
            # window that holds it stays valid when the answer comes.
            read = list(islice(self._read_newest_first(thread_id, before_seq + 1), windows.size))
            next_seq = before_seq + 1 if read and read[0].seq == before_seq else before_seq
            windows.fill(self.partition, thread_id, next_seq, read)
            cached = [link for link in read if link.seq < before_seq]
        return cached[:limit]

    def _read_newest_first(self, thread_id: str, before_seq: int) -> Iterator[ContextLink]:
        for seq in range(before_seq - 1, -1, -1):
            link = self.link(thread_id, seq)
            if link is not None:
                yield link

    def put(self, thread_id: str, record: MessageRecord, raw: bytes,
            changelog_offset: int | None = None) -> None:
        """Stage message `record.seq` (its messages-topic bytes `raw`)."""
        self.store.put(_row(thread_id, record.seq), raw, changelog_offset)
        self.store.put(_context_row(thread_id, record.seq), _context_value(record))
        if self.windows is not None:
            self.windows.stored(self.partition, thread_id, _link(record))
        message = record.message
        if message.role == "user":
            self.store.put(_index(thread_id, message.message_id), record.seq.to_bytes(8, "big"))
        elif not self._answers_own_question(thread_id, record):
            self.store.put(_answer_index(thread_id, message.run_id), record.seq.to_bytes(8, "big"))

    def _answers_own_question(self, thread_id: str, record: MessageRecord) -> bool:
        parent_seq = parent_seq_of(record)
        parent = self.link(thread_id, parent_seq) if parent_seq >= 0 else None
        return parent is not None and parent.message.role == "user" and \
            run_id_for(thread_id, parent.message.message_id) == record.message.run_id

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
            elif message is not None:
                self.store.delete(_answer_index(thread_id, message.run_id))
        self.store.delete(_context_row(thread_id, seq))
        self.store.delete(row, changelog_offset)
        if self.windows is not None:
            self.windows.drop(self.partition, thread_id)

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
