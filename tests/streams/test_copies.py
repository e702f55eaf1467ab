"""Thread copies (`streams.core.copies` through `decide`): the source decides
`ThreadCopied`, the copy takes its parts in order, once, and no post until the last.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from hypothesis import example, given
from hypothesis import strategies as st

from streams.core.copies import MAX_PART_MESSAGES, copied_message, imported_writes, split_parts
from streams.core.domain import (
    CopiedMessage,
    CopyThread,
    DeleteThread,
    EditMessage,
    Event,
    HistoryImported,
    ImportHistory,
    Known,
    PostUserMessage,
    RejectReason,
    RunRejected,
    RunStatus,
    StoredMessage,
    SwitchBranch,
    ThreadCopied,
    ThreadCreated,
    ThreadDeleted,
    ThreadState,
)
from streams.core.records import MessageRecord
from streams.core.thread import apply, decide, initial_state
from tests.streams.test_thread import POLICY, TENANT, T, accepted, completed_event, created

COPY = "thread-copy"
ANSWERED = [created(), *accepted("m-1"), completed_event()]  # seq 0 and 1, no run active
NOW = 5_000


def _state(history: Iterable[Event]) -> ThreadState | None:
    return apply(initial_state(), history, POLICY)


def _message(seq: int, role: str = "user") -> CopiedMessage:
    return CopiedMessage(seq, StoredMessage(f"m{seq}", role, f"text {seq}", "r", seq),
                         RunStatus.COMPLETED if role == "user" else None)


def _part(part: int, parts: int, seqs: Iterable[int] = (), count: int = 4, head: int = -1,
          tips: tuple[int, ...] = (), tenant: str = TENANT, source: str = T) -> ImportHistory:
    return ImportHistory(COPY, tenant, source, "the copy", part, parts,
                         tuple(_message(s) for s in seqs), count, head, tips, NOW)


# --- the source ---------------------------------------------------------------------


def test_a_copy_of_a_thread_decides_thread_copied_with_its_parts() -> None:
    """A copy of a thread decides ThreadCopied with its parts and leaves the source as it was."""
    state = _state(ANSWERED)
    events = decide(state, CopyThread(T, TENANT, COPY, "the copy", NOW), POLICY, Known(copy_parts=3))
    assert events == [ThreadCopied(T, COPY, 2, 3, NOW)]
    assert apply(state, events, POLICY) == state  # the source is not changed by a copy


def test_a_copy_is_refused_for_an_unknown_thread_another_tenant_a_bad_id_or_too_many_parts() -> None:
    """A copy is refused for an unknown thread, another tenant, a bad id or too many parts."""
    state = _state(ANSWERED)

    def reason(state: ThreadState | None, command: CopyThread, parts: int = 1) -> RejectReason:
        events = decide(state, command, POLICY, Known(copy_parts=parts))
        assert len(events) == 1 and isinstance(events[0], RunRejected)
        assert events[0].message_id == command.target_thread_id
        return events[0].reason

    assert reason(None, CopyThread(T, TENANT, COPY, "", NOW)) is RejectReason.UNKNOWN_THREAD
    assert reason(state, CopyThread(T, "other", COPY, "", NOW)) is RejectReason.UNKNOWN_THREAD
    assert reason(state, CopyThread(T, TENANT, "", "", NOW)) is RejectReason.INVALID
    assert reason(state, CopyThread(T, TENANT, T, "", NOW)) is RejectReason.INVALID
    assert reason(state, CopyThread(T, TENANT, "x" * 256, "", NOW)) is RejectReason.INVALID
    assert reason(state, CopyThread(T, TENANT, COPY, "", NOW), 101) is RejectReason.INVALID


def test_a_message_whose_run_had_not_ended_reads_cancelled_in_the_copy() -> None:
    """A message whose run had not ended reads cancelled in the copy; ended ones keep their status."""
    stored = StoredMessage("m", "user", "hi", "r", 1)
    assert copied_message(MessageRecord(3, stored, RunStatus.RUNNING, 1, 1)) == \
        CopiedMessage(3, stored, RunStatus.CANCELLED, 1, 1)
    for status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, None):
        assert copied_message(MessageRecord(3, stored, status, 2, None)).run_status is status


# --- the copy -----------------------------------------------------------------------


def test_the_parts_create_the_copy_fill_it_and_the_last_makes_it_take_posts() -> None:
    """Part 0 creates the copy, the parts fill it in order, and the last makes it take posts."""
    parts = [_part(0, 3, [0, 1]), _part(1, 3, [2]), _part(2, 3, [3], head=2, tips=(3,))]
    first = decide(None, parts[0], POLICY)
    assert first == [ThreadCreated(COPY, TENANT, "the copy", NOW),
                     HistoryImported(COPY, T, 0, 3, 2, 4, -1, (), NOW)]
    state = _state(first)
    assert state is not None and state.import_parts_left == 2 and state.copied_from == T
    post = PostUserMessage(COPY, TENANT, "m-new", "hello", None, NOW)
    refused = decide(state, post, POLICY)
    assert [(type(e), getattr(e, "reason", None)) for e in refused] == \
        [(RunRejected, RejectReason.CONFLICT)]
    assert decide(state, SwitchBranch(COPY, TENANT, 0, NOW), POLICY) == []
    assert decide(state, parts[2], POLICY) == []  # out of order: not the part it waits for
    state = _state([*first, *decide(state, parts[1], POLICY)])
    assert state is not None and state.import_parts_left == 1
    last = decide(state, parts[2], POLICY)
    assert last == [HistoryImported(COPY, T, 2, 3, 1, 4, 2, (3,), NOW)]
    state = apply(state, last, POLICY)
    assert state is not None
    assert (state.import_parts_left, state.message_count, state.head_seq, state.tip_seqs) == \
        (0, 4, 2, (3,))
    assert decide(state, parts[2], POLICY) == []  # a part again decides nothing
    accepted_post = decide(state, post, POLICY)
    assert not any(isinstance(e, RunRejected) for e in accepted_post)
    assert accepted_post  # the copy takes posts now


def test_a_first_part_for_an_existing_thread_and_a_foreign_part_decide_nothing() -> None:
    """A first part for an existing thread, or a part of another copy, decides nothing."""
    existing = _state([ThreadCreated(COPY, TENANT, "t", 1)])
    assert decide(existing, _part(0, 1, [0]), POLICY) == []
    state = _state(decide(None, _part(0, 2, [0]), POLICY))
    assert decide(state, _part(1, 2, [1], source="another"), POLICY) == []
    assert decide(state, _part(1, 2, [1], tenant="other"), POLICY) == []


def test_malformed_parts_decide_nothing() -> None:
    """Malformed parts decide nothing."""
    assert decide(None, _part(0, 0), POLICY) == []
    assert decide(None, _part(0, 1, [2, 1]), POLICY) == []  # seqs not ascending
    assert decide(None, _part(0, 1, [4]), POLICY) == []  # past the message count
    assert decide(None, _part(0, 1, head=9), POLICY) == []
    assert decide(None, _part(0, 1, tips=(7,)), POLICY) == []
    assert decide(None, _part(0, 1, tips=tuple(range(POLICY.max_branches)), count=500),
                  POLICY) == []
    assert decide(None, _part(0, 1, range(MAX_PART_MESSAGES + 1), count=1000), POLICY) == []


def test_a_copy_deleted_while_its_parts_come_stays_deleted() -> None:
    """A copy deleted while its parts come stays deleted."""
    first = decide(None, _part(0, 2, [0]), POLICY)
    state = _state(first)
    deleted = decide(state, DeleteThread(COPY, TENANT, NOW), POLICY)
    assert [type(e) for e in deleted] == [ThreadDeleted]
    assert decide(apply(state, deleted, POLICY), _part(1, 2, [1]), POLICY) == []


def test_an_edit_of_a_thread_being_copied_into_is_refused_under_its_new_id() -> None:
    """An edit of a thread being copied into is refused under its new message id."""
    state = _state(decide(None, _part(0, 2, [0]), POLICY))
    events = decide(state, EditMessage(COPY, TENANT, "m0", "m0-e", "x", None, NOW), POLICY)
    assert isinstance(events[0], RunRejected) and events[0].message_id == "m0-e"


def test_a_part_writes_its_messages_at_their_own_seqs() -> None:
    """A part writes its messages at their own seqs."""
    part = _part(0, 1, [0, 2, 3])
    writes = imported_writes(part)
    assert [(w.seq, w.message.message_id, w.run_status) for w in writes] == \
        [(0, "m0", RunStatus.COMPLETED), (2, "m2", RunStatus.COMPLETED), (3, "m3", RunStatus.COMPLETED)]


# --- cutting the history into parts ---------------------------------------------------


@given(sizes=st.lists(st.integers(1, 2_000), max_size=300), budget=st.integers(1, 5_000),
       per_part=st.integers(1, 40))
@example(sizes=[], budget=1, per_part=1)
@example(sizes=[5_000], budget=10, per_part=1)
def test_split_parts_covers_every_message_once_in_order_within_the_bounds(
        sizes: list[int], budget: int, per_part: int) -> None:
    """Parts cover every message once, in order, within both bounds, cut greedily."""
    parts = split_parts(sizes, budget, per_part)
    assert [i for part in parts for i in part] == list(range(len(sizes)))
    assert parts and all(len(part) <= per_part for part in parts)
    assert all(len(part) == 1 or sum(sizes[i] for i in part) <= budget for part in parts)
    assert all(len(part) for part in parts) or parts == [range(0)]
    # Greedy: no part could have taken the next part's first message.
    for part, after in pairwise(parts):
        grown = [*part, after[0]]
        assert len(grown) > per_part or sum(sizes[i] for i in grown) > budget
