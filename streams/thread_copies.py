"""The processor's side of a thread copy (`streams.core.copies`): the source's stored
history read from the history table and cut into `ImportHistory` parts.

Every part fits in one record: parts are cut by the stored records' sizes (a copied
message is its record less the envelope) against half the record limit, which also
leaves room for the part's own envelope and branch tips. A thread whose copy would
need more than `MAX_PARTS` parts is refused as too large: all parts go out in one
transaction, so this also bounds what one decision writes.
"""

from __future__ import annotations

from streams.core.copies import MAX_PART_MESSAGES, MAX_PARTS, copied_message, split_parts
from streams.core.domain import CopyThread, ImportHistory, ThreadState
from streams.core.records import MessageRecord
from streams.message_store import MessageStore

__all__ = ["import_parts", "import_commands"]


def import_parts(state: ThreadState, history: MessageStore,
                 max_record_bytes: int) -> list[list[MessageRecord]] | None:
    """The thread's stored messages cut into parts, oldest first; None if it takes more
    than `MAX_PARTS` (the thread is too large to copy)."""
    if state.message_count > MAX_PARTS * MAX_PART_MESSAGES:
        return None  # too large whatever the texts: no need to read it
    records: list[MessageRecord] = []
    sizes: list[int] = []
    for seq in range(state.message_count):
        raw = history.raw(state.thread_id, seq)
        if raw is not None:  # None: a gap, a rolled-back run's message
            records.append(history.codec.decode_message(raw)[1])
            sizes.append(len(raw))
    parts = split_parts(sizes, max_record_bytes // 2)
    if len(parts) > MAX_PARTS:
        return None
    return [[records[i] for i in part] for part in parts]


def import_commands(command: CopyThread, state: ThreadState,
                    parts: list[list[MessageRecord]]) -> list[ImportHistory]:
    """The commands that carry `parts` to the copy, in order."""
    return [ImportHistory(
        thread_id=command.target_thread_id, tenant=state.tenant,
        source_thread_id=state.thread_id, title=command.title, part=index, parts=len(parts),
        messages=tuple(copied_message(record) for record in part),
        message_count=state.message_count, head_seq=state.head_seq, tip_seqs=state.tip_seqs,
        now_ms=command.now_ms) for index, part in enumerate(parts)]
