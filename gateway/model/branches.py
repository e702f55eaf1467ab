"""A thread's branches as the reads show them (docs/branches.md), over the read store.

Pure: it walks the tree through a `link(seq)` lookup (`ReadStore.link`, two point
reads and no decode per message) with the core's own `branch_path`, so the reads
and the processor agree on what a branch is. A branch is named by its head (the
current branch) or tip seq; a thread that never branched has one branch and is
read as before, by range scan (`is_straight`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from streams.core.branches import ROOT, Linked, branch_path, head_of
from streams.core.domain import ThreadState

__all__ = ["Branch", "branch_heads", "branches", "is_straight", "page_of", "path_oldest_first"]

LinkAt = Callable[[int], Linked | None]


@dataclass(frozen=True, slots=True)
class Branch:
    """One branch of a thread, named by `seq`, its newest message."""

    seq: int  # its head (the current branch) or tip
    current: bool
    # Where it leaves the current branch: the newest message the two share (-1: none,
    # an edit of the first message), and its first message of its own (None: the
    # current branch, or a tip that lies on the current branch's path).
    fork_seq: int
    first_seq: int | None
    message_count: int  # messages on its path, root to `seq`


def is_straight(state: ThreadState) -> bool:
    """Whether the thread never branched: its messages are its one branch, in seq order
    (a regenerate or edit always leaves a tip behind)."""
    return not state.tip_seqs and state.head_seq == -1


def branch_heads(state: ThreadState) -> list[int]:
    """The seqs naming the thread's branches: the current head first, then the tips,
    oldest first (a branch with no message, its only one rolled back, is `ROOT`)."""
    return [head_of(state), *state.tip_seqs]


def path_oldest_first(seq: int, link: LinkAt) -> list[int]:
    """The branch ending at `seq`: its messages' seqs from the root, oldest first."""
    path = list(branch_path(seq, link))
    path.reverse()
    return path


def page_of(path: list[int], *, after: int | None, before: int | None,
            limit: int) -> tuple[list[int], bool]:
    """One page of a branch's seqs (`path`, oldest first) as message pages go: the first
    `limit` after `after`, or with `before` alone the last ones before it; and whether
    more lie past the page in the direction read."""
    if after is not None:
        path = [s for s in path if s > after]
    if before is not None:
        path = [s for s in path if s < before]
    backward = before is not None and after is None
    return (path[-limit:] if backward else path[:limit]), len(path) > limit


def branches(state: ThreadState, link: LinkAt) -> list[Branch]:
    """Every branch of the thread, the current one first, with where each forks from
    it. Reads the current path once, then each tip's own messages down to the fork."""
    head = head_of(state)
    current = path_oldest_first(head, link)
    position = {seq: i for i, seq in enumerate(current)}
    found = [Branch(head, True, head, None, len(current))]
    for tip in state.tip_seqs:
        own: list[int] = []
        fork = ROOT
        for seq in branch_path(tip, link):
            if seq in position:
                fork = seq
                break
            own.append(seq)
        shared = position[fork] + 1 if fork != ROOT else 0
        found.append(Branch(tip, False, fork, own[-1] if own else None, shared + len(own)))
    return found
