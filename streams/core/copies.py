"""Copies of a thread (LangGraph's `threads.copy`): a new thread holding every branch
of the source's stored history, at the same seqs, so each message keeps its place,
its parent and its checkpoint.

Pure, like `streams.core.thread`. The source and the copy live on different
partitions, so no one decision can write both. The processor of the source decides
`CopyThread` into `ThreadCopied` and, in the same transaction, writes the source's
stored messages to the commands topic as `ImportHistory` parts keyed by the copy.
Exactly-once produce makes the parts appear all or none, in order, once; the copy's
processor then decides each in turn:

    CopyThread          (source) -> ThreadCopied, + ImportHistory 0 .. n-1 on commands
    ImportHistory 0     (copy)   -> ThreadCreated, HistoryImported   parts left: n - 1
    ImportHistory k     (copy)   -> HistoryImported                  parts left: n - k - 1
    ImportHistory n - 1 (copy)   -> HistoryImported                  0: it takes posts

Until its last part is in, the copy refuses what would store a message (`conflict`)
and ignores what would change it otherwise; a delete still deletes it, and the parts
after a delete decide nothing.

Bounded: a part holds at most `MAX_PART_MESSAGES` messages and fits in one record
(the shell splits by encoded size, `split_parts`); a copy holds what the source
held, branches included (the source's are below `Policy.max_branches`). Runs stay
with the source: a user message whose run had not ended reads cancelled in the copy,
and its idempotency keys are not copied (a key names a request to the source).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise

from streams.core.domain import (
    Command,
    CopiedMessage,
    CopyThread,
    DeleteThread,
    EditMessage,
    Event,
    HistoryImported,
    ImportHistory,
    Known,
    Policy,
    PostUserMessage,
    RegenerateAnswer,
    RejectReason,
    RunRejected,
    RunStatus,
    ThreadCopied,
    ThreadCreated,
    ThreadState,
)
from streams.core.history import MessagePut
from streams.core.records import MessageRecord

__all__ = [
    "MAX_PARTS",
    "MAX_PART_MESSAGES",
    "copied_message",
    "decide_copy",
    "decide_import",
    "imported_writes",
    "refuse_while_importing",
    "split_parts",
    "with_history_imported",
]

MAX_PART_MESSAGES = 500
# A thread's messages are not capped, but a copy's parts are: 100 parts of up to
# 500 messages each. The shell refuses a copy that would need more (`invalid`).
MAX_PARTS = 100
_ROOT_HEAD = -2  # ThreadState.head_seq of a current branch with no message


def split_parts(sizes: Sequence[int], budget: int,
                max_messages: int = MAX_PART_MESSAGES) -> list[range]:
    """Consecutive index ranges over messages of encoded `sizes` such that each range
    holds at most `max_messages` and, unless it is a single message, at most `budget`
    bytes; always at least one range (an empty history is one empty part)."""
    parts: list[range] = []
    start, used = 0, 0
    for index, size in enumerate(sizes):
        if index > start and (used + size > budget or index - start >= max_messages):
            parts.append(range(start, index))
            start, used = index, 0
        used += size
    parts.append(range(start, len(sizes)))
    return parts


def copied_message(record: MessageRecord) -> CopiedMessage:
    """`record` as it goes into a copy: a run that had not ended reads cancelled there."""
    status = record.run_status
    if status is not None and not status.is_terminal:
        status = RunStatus.CANCELLED
    return CopiedMessage(seq=record.seq, message=record.message, run_status=status,
                         run_attempts=record.run_attempts, parent_seq=record.parent_seq)


def decide_copy(state: ThreadState | None, command: CopyThread, policy: Policy,
                known: Known) -> list[Event]:
    """`ThreadCopied`, or why not: the shell writes the parts (`known.copy_parts` of
    them) when this decides `ThreadCopied`."""
    def reject(reason: RejectReason, detail: str) -> list[Event]:
        return [RunRejected(thread_id=command.thread_id, message_id=command.target_thread_id,
                            reason=reason, detail=detail, existing_run_id=None,
                            at_ms=command.now_ms)]

    if state is None or state.tenant != command.tenant:
        return reject(RejectReason.UNKNOWN_THREAD, "no such thread")
    target = command.target_thread_id
    if not target or len(target) > policy.max_id_chars or target == command.thread_id:
        return reject(RejectReason.INVALID, "the copy needs a new thread id of 1 to "
                      f"{policy.max_id_chars} characters")
    if not 1 <= known.copy_parts <= MAX_PARTS:
        return reject(RejectReason.INVALID, "the thread is too large to copy")
    if state.import_parts_left:  # refused before this by `refuse_while_importing`
        return reject(RejectReason.CONFLICT, "the thread is itself being copied into")
    return [ThreadCopied(thread_id=command.thread_id, target_thread_id=target,
                         message_count=state.message_count, parts=known.copy_parts,
                         at_ms=command.now_ms)]


def decide_import(state: ThreadState | None, command: ImportHistory,
                  policy: Policy) -> list[Event]:
    """What part `command.part` of a copy decides: nothing unless it is the part the
    copy waits for (part 0: the thread must not exist) and well formed."""
    if not _well_formed(command, policy):
        return []
    imported = HistoryImported(
        thread_id=command.thread_id, source_thread_id=command.source_thread_id,
        part=command.part, parts=command.parts, count=len(command.messages),
        message_count=command.message_count, head_seq=command.head_seq,
        tip_seqs=command.tip_seqs, at_ms=command.now_ms)
    if command.part == 0:
        if state is not None:
            return []
        return [ThreadCreated(thread_id=command.thread_id, tenant=command.tenant,
                              title=command.title[: policy.max_title_chars],
                              at_ms=command.now_ms), imported]
    if state is None or state.tenant != command.tenant or \
            state.copied_from != command.source_thread_id or \
            state.import_parts_left != command.parts - command.part:
        return []
    return [imported]


def _well_formed(command: ImportHistory, policy: Policy) -> bool:
    count = command.message_count
    seqs = [m.seq for m in command.messages]
    return (0 < len(command.thread_id) <= policy.max_id_chars
            and 0 <= command.part < command.parts <= MAX_PARTS
            and len(command.messages) <= MAX_PART_MESSAGES
            and all(0 <= a < b for a, b in pairwise(seqs))
            and all(0 <= seq < count for seq in seqs[:1] + seqs[-1:])
            and _ROOT_HEAD <= command.head_seq < count
            and len(command.tip_seqs) < policy.max_branches
            and all(0 <= tip < count for tip in command.tip_seqs))


def with_history_imported(state: ThreadState, event: HistoryImported) -> ThreadState:
    """`state` after a part of its copy's history was stored."""
    return replace(state, copied_from=event.source_thread_id,
                   import_parts_left=event.parts - event.part - 1,
                   message_count=max(state.message_count, event.message_count),
                   head_seq=event.head_seq, tip_seqs=event.tip_seqs,
                   updated_at_ms=event.at_ms)


def imported_writes(command: ImportHistory) -> list[MessagePut]:
    """The history records a decided part writes: its messages, at their own seqs."""
    return [MessagePut(m.seq, m.message, m.run_status, m.run_attempts, m.parent_seq)
            for m in command.messages]


def refuse_while_importing(state: ThreadState, command: Command) -> list[Event] | None:
    """What a command decides on a thread still being copied into: a post, edit,
    regenerate or copy is refused (`conflict`: retry once the copy is in), anything
    else but its parts and a delete decides nothing; None: decide it as usual."""
    if not state.import_parts_left or isinstance(command, ImportHistory | DeleteThread):
        return None
    detail = "the thread is being copied into; retry once the copy is complete"
    match command:
        case PostUserMessage() | RegenerateAnswer():
            message_id = command.message_id
        case EditMessage():
            message_id = command.new_message_id
        case CopyThread():
            message_id = command.target_thread_id
        case _:
            return []
    return [RunRejected(thread_id=state.thread_id, message_id=message_id,
                        reason=RejectReason.CONFLICT, detail=detail, existing_run_id=None,
                        at_ms=command.now_ms)]
