"""A thread's history as a tree: branches, their heads, and the path a run sees.

Pure, like `streams.core.thread`, which calls it. Messages stay one record each on
the messages topic (`streams.core.history`); a branch copies nothing. Each record
may name its parent (`MessageRecord.parent_seq`); a record without one continues
from the message before it (seq - 1), which is what every record written before
branches means, so an old thread reads as the straight line it was.

    seq:     0    1    2    3    4    5
             U0 - A1 - U2 - A3              the branch that was current
                       \\
                        U4 - A5              an edit of U2: U4's parent is 1

The state names the current branch by its head (`ThreadState.head_seq`: -1 means
the newest message, always the case on a thread that never branched) and keeps the
heads of the other branches (`tip_seqs`), so it stays bounded (`Policy.max_branches`):

- A message or answer stored on the current branch becomes its head.
- A message stored with a parent of its own (an edit, `MessageAccepted.parent_seq`)
  starts a branch of its own; `BranchSwitched` makes it current (at once, or when
  its queued run starts). A regenerate switches to the user message it answers
  again, whose new answer then continues from there.
- `BranchSwitched` keeps the head it leaves as a tip, and takes the new head out of
  the tips. The partial answer of a run interrupted on a branch that is no longer
  current (`interrupted_tip_seq`) goes to that branch's tip.
- A rolled-back user message is tombstoned, and a head that was that message moves
  to its parent (`RunAccepted.parent_seq` tells the run's); the records that
  followed it are relinked to that parent (`history.relinked`). A path that meets a
  missing record continues from the message before it (the straight-line rule, exact
  for a message whose parent was the one before it).
- A tip may lie on another branch's path (the head a rolled-back or failed run left
  at an earlier message); it still counts as a branch of its own.

Deleting a thread tombstones seq 0 .. message_count - 1: every branch's records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Protocol

from streams.core.domain import ActiveRun, ThreadState
from streams.core.ids import run_id_for

__all__ = [
    "ROOT",
    "Linked",
    "branch_count",
    "branch_path",
    "forks_left",
    "head_of",
    "is_own_run",
    "parent_seq_of",
    "queued_forks",
    "run_context_seqs",
    "stored_parent",
    "with_branch_switched",
    "with_head",
    "with_message_stored",
    "with_rollback",
]

ROOT = -1  # the parent of a thread's first message, and of an edit of a first message
_ROOT_HEAD = -2  # head_seq of a current branch with no message (its only one rolled back)


class Linked(Protocol):
    """A stored message record as far as the tree goes (a `MessageRecord`)."""

    @property
    def seq(self) -> int:
        """Its position in the thread."""
    @property
    def parent_seq(self) -> int | None:
        """Its parent's seq; None: the message before it."""


def head_of(state: ThreadState) -> int:
    """The seq of the current branch's head; `ROOT` if the branch has no message."""
    if state.head_seq == _ROOT_HEAD:
        return ROOT
    return state.head_seq if state.head_seq >= 0 else state.message_count - 1


def with_head(state: ThreadState, head: int) -> ThreadState:
    """`state` with the current branch's head at `head`, written canonically: -1 when it
    is the newest message, so a thread that never branched keeps the default."""
    encoded = -1 if head == state.message_count - 1 else _ROOT_HEAD if head == ROOT else head
    return state if encoded == state.head_seq else replace(state, head_seq=encoded)


def branch_count(state: ThreadState) -> int:
    """The thread's branches, the current one included."""
    return 1 + len(state.tip_seqs)


def queued_forks(state: ThreadState) -> int:
    """Queued regenerates: each may add a branch when its run starts (an edit added its
    branch when its message was stored)."""
    return sum(1 for q in state.queued if q.branch and q.run_id is not None)


def forks_left(state: ThreadState, max_branches: int) -> int:
    """How many more branches regenerates and edits may make now."""
    return max_branches - branch_count(state) - queued_forks(state)


def stored_parent(seq: int, parent: int) -> int | None:
    """`MessageRecord.parent_seq` of a record at `seq` whose parent is `parent`: None
    (the message before it) unless the parent is another one."""
    return None if parent == seq - 1 else parent


def with_message_stored(state: ThreadState, parent: int, on_branch: bool) -> ThreadState:
    """`state` after a message is stored at seq `message_count` with parent `parent`.

    `on_branch`: it continues the current branch and becomes its head (its parent is
    the head). Otherwise it extends the branch whose tip is `parent`, or starts a
    branch of its own; the current head stays where it is."""
    seq, head = state.message_count, head_of(state)
    if on_branch:
        return with_head(replace(state, message_count=seq + 1), seq)
    tips = state.tip_seqs
    tips = tuple(seq if t == parent else t for t in tips) if parent in tips else (*tips, seq)
    interrupted_tip = seq if state.interrupted_tip_seq == parent >= 0 else state.interrupted_tip_seq
    return with_head(replace(state, message_count=seq + 1, tip_seqs=tips,
                             interrupted_tip_seq=interrupted_tip), head)


def with_branch_switched(state: ThreadState, seq: int) -> ThreadState:
    """`state` after `BranchSwitched(seq)`: the head it leaves becomes a tip."""
    head = head_of(state)
    if seq == head:
        return state
    # A branch left with no message (its only one rolled back) is not kept.
    tips = (*(t for t in state.tip_seqs if t != seq), *((head,) if head != ROOT else ()))
    interrupted_tip = state.interrupted_tip_seq
    if state.interrupted is not None and interrupted_tip < 0:
        interrupted_tip = head  # its partial answer belongs to the branch left behind
    if interrupted_tip == seq:
        interrupted_tip = -1  # that branch is current again
    return with_head(replace(state, tip_seqs=tips, interrupted_tip_seq=interrupted_tip), seq)


def with_rollback(state: ThreadState, run: ActiveRun) -> ThreadState:
    """`state` after `run` was rolled back: if its own user message was the head, the
    head moves to that message's parent. A regenerate's run removes nothing (its user
    message is an earlier run's)."""
    if not is_own_run(state.thread_id, run) or head_of(state) != run.message_seq:
        return state
    return with_head(state, run.message_seq - 1 if run.parent_seq is None else run.parent_seq)


def is_own_run(thread_id: str, run: ActiveRun) -> bool:
    """Whether `run` is its user message's own run, not a regenerate's: only that one
    rewrites the message's record when it ends, or tombstones it when rolled back."""
    return run.message_seq >= 0 and run.run_id == run_id_for(thread_id, run.message_id)


def parent_seq_of(record: Linked) -> int:
    """The parent of a stored record: its `parent_seq`, or the message before it."""
    parent = record.parent_seq
    # A parent is always older; anything else is not ours and reads as a straight line.
    return record.seq - 1 if parent is None or not ROOT <= parent < record.seq else parent


def branch_path(seq: int, record_at: Callable[[int], Linked | None]) -> Iterator[int]:
    """The seqs from message `seq` up to its root through the parent links, newest first.

    `record_at(seq)` is the stored record or None (never stored, or tombstoned by a
    rollback): a missing record is skipped and the path continues at the seq before it."""
    while seq > ROOT:
        record = record_at(seq)
        if record is None:
            seq -= 1
            continue
        yield seq
        seq = parent_seq_of(record)


def run_context_seqs(state: ThreadState,
                     record_at: Callable[[int], Linked | None]) -> Iterator[int]:
    """The history the active run answers from, newest first: the current branch from
    its head, less the run's own message and the messages still queued (they are not
    context yet). For a run that just started this is the path above its message; a
    queued message's run also sees what its branch stored while it waited, as before."""
    run = state.active_run
    skip = {q.seq for q in state.queued}
    if run is not None:
        skip.add(run.message_seq)
    return (seq for seq in branch_path(head_of(state), record_at) if seq not in skip)
