"""A thread's stored history: which message records each decision writes.

Pure, like `streams.core.thread`. The decision state holds no messages (its size must
not grow with the thread); each stored user or assistant message is its own record
on the messages topic, keyed `<thread_id>/<seq as 20 digits>` and written in the
same transaction as the decision that stores it. A seq key (not the message id)
because it sorts in thread order, cannot collide whatever characters the ids hold
(the last 20 characters are digits, the rest is the thread id), and lets a delete
tombstone seq 0 .. message_count - 1 without reading anything.

A user message's record carries the status of the run it started; it is rewritten
when the run ends, so the history alone answers "what happened to this message".
A run rolled back by a later post (multitask_strategy rollback) has its user
message tombstoned instead (`MessageRemoved`); its events stay on the events topic.
A run interrupted by a later post (multitask_strategy interrupt) keeps its user
message (run status cancelled) and, once its worker reports what it had streamed,
gets that partial answer as an assistant record marked with run status cancelled
(`PartialAnswerStored`), at the next seq: after the interrupting question.

Branches (`streams.core.branches`): a record names its parent (`parent_seq`) when
that is not the message before it, so a thread that never branched writes what it
always did. A regenerate's run rewrites nothing when it ends and removes nothing
when rolled back: its user message belongs to the message's own, earlier run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from streams.core.branches import head_of, is_own_run, parent_seq_of, stored_parent
from streams.core.domain import (
    Event,
    MessageAccepted,
    PartialAnswerStored,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStatus,
    StoredMessage,
    ThreadDeleted,
    ThreadState,
)
from streams.core.ids import run_id_for
from streams.core.reasons import CancelReason
from streams.core.records import HistoryMessage, MessageRecord

__all__ = [
    "SEQ_DIGITS",
    "HistoryErased",
    "HistoryWrite",
    "MessagePut",
    "MessageRemoved",
    "RunStatusChanged",
    "context_window",
    "history_writes",
    "message_key",
    "parse_message_key",
    "relinked",
]

SEQ_DIGITS = 20  # a long in decimal


@dataclass(frozen=True, slots=True)
class MessagePut:
    """Store `message` as the thread's message number `seq`."""

    seq: int
    message: StoredMessage
    # user messages: their run's status; None for answers, CANCELLED for the partial
    # answer of an interrupted run (PartialAnswerStored)
    run_status: RunStatus | None
    run_attempts: int = 0
    parent_seq: int | None = None  # None: the message before it (seq - 1)


@dataclass(frozen=True, slots=True)
class RunStatusChanged:
    """The run of the user message `seq` ended: rewrite that record with its status."""

    seq: int
    run_status: RunStatus
    run_attempts: int


@dataclass(frozen=True, slots=True)
class HistoryErased:
    """The thread is deleted: tombstone messages 0 .. message_count - 1."""

    message_count: int


@dataclass(frozen=True, slots=True)
class MessageRemoved:
    """A rolled-back run's message `seq` leaves the history: a tombstone of its key.

    With `parent_seq` (the message had a parent other than the one before it, on a
    branched thread), every record stored after it whose parent it was is rewritten
    with `parent_seq` as its parent (`relinked`), since a path through a tombstone
    can only go on at the seq before it."""

    seq: int
    parent_seq: int | None = None


HistoryWrite = MessagePut | RunStatusChanged | HistoryErased | MessageRemoved


def message_key(thread_id: str, seq: int) -> bytes:
    """The record key of message `seq` of `thread_id` on the messages topic."""
    return f"{thread_id}/{seq:0{SEQ_DIGITS}d}".encode("utf-8", "surrogatepass")


def parse_message_key(key: bytes) -> tuple[str, int]:
    """(thread_id, seq) of a messages-topic key; ValueError if it is not one."""
    text = key.decode("utf-8", "surrogatepass")
    thread_id, slash, digits = text[: -SEQ_DIGITS - 1], text[-SEQ_DIGITS - 1], text[-SEQ_DIGITS:]
    if slash != "/" or len(digits) != SEQ_DIGITS or not digits.isdigit():
        raise ValueError(f"not a message key: {key[:80]!r}")
    return thread_id, int(digits)


def history_writes(before: ThreadState | None, event: Event) -> list[HistoryWrite]:
    """What `event`, decided on `before`, writes to the thread's history."""
    if before is None:
        return []
    match event:
        case MessageAccepted():
            message = StoredMessage(message_id=event.message_id, role="user", text=event.text,
                                    run_id=run_id_for(before.thread_id, event.message_id),
                                    created_at_ms=event.at_ms)
            parent = head_of(before) if event.parent_seq is None else event.parent_seq
            return [MessagePut(before.message_count, message, RunStatus.DISPATCHED,
                               parent_seq=stored_parent(before.message_count, parent))]
        case RunCompleted():
            run = before.active_run
            if run is None or run.run_id != event.run_id:
                return []
            answer = StoredMessage(message_id=event.message.message_id, role="assistant",
                                   text=event.message.text, run_id=run.run_id,
                                   created_at_ms=event.at_ms, steps=event.message.steps,
                                   citations=event.message.citations)
            return [MessagePut(before.message_count, answer, None,
                               parent_seq=stored_parent(before.message_count, head_of(before))),
                    *_run_ended(before, event.run_id, RunStatus.COMPLETED)]
        case RunFailed():
            return _run_ended(before, event.run_id, RunStatus.FAILED)
        case RunCancelled() if event.reason == CancelReason.ROLLED_BACK:
            run = before.active_run
            if run is None or run.run_id != event.run_id or not is_own_run(before.thread_id, run):
                return []
            return [MessageRemoved(run.message_seq, run.parent_seq)]
        case RunCancelled():
            return _run_ended(before, event.run_id, RunStatus.CANCELLED)
        case PartialAnswerStored():  # marked: an answer record whose run was cancelled
            answer = StoredMessage(message_id=event.message.message_id, role="assistant",
                                   text=event.message.text, run_id=event.run_id,
                                   created_at_ms=event.at_ms, steps=event.message.steps,
                                   citations=event.message.citations)
            tip = before.interrupted_tip_seq  # its branch, if no longer the current one
            parent = tip if tip >= 0 else head_of(before)
            return [MessagePut(before.message_count, answer, RunStatus.CANCELLED,
                               event.attempt, stored_parent(before.message_count, parent))]
        case ThreadDeleted():
            return [HistoryErased(before.message_count)]
        case _:
            return []


def relinked(record: MessageRecord, removed: MessageRemoved) -> MessageRecord | None:
    """`record` with the removed message's parent as its own, if the removed message
    was its parent and had a parent of its own; None if it stays as it is."""
    if removed.parent_seq is None or record.seq <= removed.seq or \
            parent_seq_of(record) != removed.seq:
        return None
    return replace(record, parent_seq=stored_parent(record.seq, removed.parent_seq))


def _run_ended(before: ThreadState, run_id: str, status: RunStatus) -> list[HistoryWrite]:
    run = before.active_run
    if run is None or run.run_id != run_id or not is_own_run(before.thread_id, run):
        return []
    return [RunStatusChanged(run.message_seq, status, run.attempt)]


class _Said(Protocol):
    """A message as an agent sees it (a StoredMessage or a HistoryMessage)."""

    @property
    def message_id(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def text(self) -> str: ...


def context_window(newest_first: Iterable[_Said], budget_chars: int,
                   max_messages: int) -> tuple[HistoryMessage, ...]:
    """The newest messages whose texts fit in `budget_chars` together (and at most
    `max_messages` of them), oldest first: what an agent gets as context."""
    picked: list[HistoryMessage] = []
    used = 0
    for message in newest_first:
        if len(picked) >= max_messages:
            break
        used += len(message.text)
        if used > budget_chars:
            break
        picked.append(message if isinstance(message, HistoryMessage)
                      else HistoryMessage(message.message_id, message.role, message.text))
    picked.reverse()
    return tuple(picked)
