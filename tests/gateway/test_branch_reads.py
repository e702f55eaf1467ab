"""The gateway's reads of a branched thread (issue #30), on the read store alone (no
broker): parent links are indexed without a decode, a branch reads as the path from
its head, the branch list says where each forks, a regenerate's run is found by its
id, and a delete leaves none of it behind."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gateway.model.branches import (
    Branch,
    branch_heads,
    branches,
    is_straight,
    page_of,
    path_oldest_first,
)
from gateway.model.read_store import MESSAGES, THREADS, Link, ReadStore
from streams.core.domain import ActiveRun, RunStatus, StoredMessage, ThreadState
from streams.core.history import message_key
from streams.core.ids import regenerate_run_id_for, run_id_for
from streams.core.records import MessageRecord
from streams.wire import Codec, new_meta

CODEC = Codec()
IDENTITY = {"topic_prefix": "x.", "partitions": 4}
T = "thread-b"

# The tree of docs/branches.md:
#   U0 - A1 - U2 - A3          tip 3
#   |         \
#   |          U4 - A5         an edit of U2 (U4's parent is 1): the current branch
#    \
#     A6                       a regenerate of U0 (A6's parent is 0): tip 6
TREE: list[tuple[str, int | None]] = [
    ("user", None), ("assistant", None), ("user", None), ("assistant", None),
    ("user", 1), ("assistant", None), ("assistant", 0)]
REGENERATE_RUN = regenerate_run_id_for(T, "key-1")


def _record(seq: int) -> MessageRecord:
    role, parent = TREE[seq]
    user = role == "user"
    run_id = run_id_for(T, f"m{seq}") if user else (
        REGENERATE_RUN if seq == 6 else run_id_for(T, f"m{seq - 1}"))
    message = StoredMessage(f"m{seq}", role, f"text {seq}", run_id, 1_000 + seq)
    return MessageRecord(seq, message, RunStatus.COMPLETED if user else None,
                         1 if user else 0, parent_seq=parent)


def _state(**changes: Any) -> ThreadState:
    return replace(ThreadState(T, "ten", "t", 500, message_count=len(TREE),
                               updated_at_ms=1_000, head_seq=5, tip_seqs=(3, 6)), **changes)


def _filled(tmp_path: Path, state: ThreadState) -> ReadStore:
    store = ReadStore(tmp_path / "store", IDENTITY, codec=Codec())
    store.apply_state(T.encode(), CODEC.encode_state(state))
    for seq in range(len(TREE)):
        store.apply_message(message_key(T, seq),
                            CODEC.encode_message(_record(seq), new_meta(T, "ten", 0)))
    store.commit({(THREADS, 0): 1, (MESSAGES, 0): len(TREE)})
    return store


def test_links_come_from_the_parent_index(tmp_path: Path) -> None:
    """A record's parent is read without decoding it: named when it has one, else None."""
    store = _filled(tmp_path, _state())
    assert store.link(T, 4) == Link(4, 1)
    assert store.link(T, 6) == Link(6, 0)
    assert store.link(T, 3) == Link(3, None)
    assert store.link(T, 7) is None and store.link("other", 0) is None


def test_each_branch_reads_as_the_path_from_its_head(tmp_path: Path) -> None:
    """The current branch, and each tip's, is the path through the parent links."""
    state = _state()
    store = _filled(tmp_path, state)
    link = partial(store.link, T)
    assert not is_straight(state) and branch_heads(state) == [5, 3, 6]
    assert path_oldest_first(5, link) == [0, 1, 4, 5]
    assert path_oldest_first(3, link) == [0, 1, 2, 3]
    assert path_oldest_first(6, link) == [0, 6]
    assert [r.message.text for r in store.messages_at(T, [0, 6])] == ["text 0", "text 6"]


def test_the_branch_list_says_where_each_forks_from_the_current_one(tmp_path: Path) -> None:
    """The current branch first; each tip with the newest message it shares with it
    and its own first message."""
    store = _filled(tmp_path, _state())
    assert branches(_state(), partial(store.link, T)) == [
        Branch(5, True, 5, None, 4),
        Branch(3, False, 1, 2, 4),  # the branch the edit left: forks after A1 at U2
        Branch(6, False, 0, 6, 2),  # the regenerate's answer: forks after U0
    ]
    switched = _state(head_seq=3, tip_seqs=(6, 5))
    assert branches(switched, partial(store.link, T))[2] == Branch(5, False, 1, 4, 4)


def test_a_tip_on_the_current_path_forks_at_itself(tmp_path: Path) -> None:
    """A tip the current branch passes through (a rolled-back run's head) has no
    message of its own."""
    store = _filled(tmp_path, _state())
    state = _state(head_seq=5, tip_seqs=(1,))
    assert branches(state, partial(store.link, T))[1] == Branch(1, False, 1, None, 2)


def test_pages_of_a_branch_go_as_message_pages_do() -> None:
    """`after` forward, `before` alone backward, `more` past the page."""
    path = [0, 1, 4, 5, 8, 9]
    assert page_of(path, after=None, before=None, limit=4) == ([0, 1, 4, 5], True)
    assert page_of(path, after=4, before=None, limit=4) == ([5, 8, 9], False)
    assert page_of(path, after=None, before=2**63 - 1, limit=2) == ([8, 9], True)
    assert page_of(path, after=None, before=5, limit=5) == ([0, 1, 4], False)
    assert page_of(path, after=0, before=8, limit=5) == ([1, 4, 5], False)


def test_a_straight_thread_is_read_as_before() -> None:
    """A thread that never branched has one branch: its head is its newest message."""
    state = ThreadState(T, "ten", "t", 500, message_count=4)
    assert is_straight(state) and branch_heads(state) == [3]


def test_a_regenerates_run_is_found_by_its_answer_too(tmp_path: Path) -> None:
    """With no state read that showed the run active (compacted away), its answer's
    record points the run at the question it follows; a message's own run keeps the
    user message its record names."""
    store = _filled(tmp_path, _state())
    ref = store.run(REGENERATE_RUN)
    assert ref is not None and (ref.thread_id, ref.seq) == (T, 0)
    for seq in (0, 2, 4):
        own = store.run(run_id_for(T, f"m{seq}"))
        assert own is not None and own.seq == seq


def test_a_regenerates_run_is_found_and_a_delete_erases_every_branch(tmp_path: Path) -> None:
    """The run of a regenerate names no record; the state's active run indexes it at its
    question. Deleting the thread removes its rows, links and run index."""
    active = ActiveRun(REGENERATE_RUN, "m0", 1, RunStatus.RUNNING, 1_000, 1_000, None,
                       message_seq=0, accepted_at_ms=1_000)
    store = _filled(tmp_path, _state(active_run=active))
    ref = store.run(REGENERATE_RUN)
    assert ref is not None and (ref.thread_id, ref.seq) == (T, 0)
    assert store.run(run_id_for(T, "m0")) is not None  # the message's own run, as before
    store.apply_state(T.encode(), None)
    store.commit({})
    assert store.run(REGENERATE_RUN) is None and store.link(T, 4) is None
    assert all(store.link(T, seq) is None for seq in range(len(TREE)))
    assert store.message_seq(T, "m4") is None and store.run(run_id_for(T, "m0")) is None
    # A thread of the same id written again, straight: no link is left over.
    straight = replace(_record(4), parent_seq=None)
    store.apply_message(message_key(T, 4), CODEC.encode_message(straight, new_meta(T, "ten", 0)))
    store.commit({})
    assert store.link(T, 4) == Link(4, None)


@st.composite
def _trees(draw: st.DrawFn) -> tuple[dict[int, Link], ThreadState]:
    """A thread's records (some missing: rolled back) with random parents, and a
    state whose head and tips are stored seqs."""
    n = draw(st.integers(1, 30))
    links = {}
    for seq in range(n):
        if seq and draw(st.booleans()) and draw(st.booleans()):
            continue  # tombstoned
        parent = draw(st.one_of(st.none(), st.integers(-1, seq - 1))) if seq else None
        links[seq] = Link(seq, parent)
    stored = sorted(links)
    if not stored:
        links[0], stored = Link(0, None), [0]
    heads = draw(st.lists(st.sampled_from(stored), min_size=1, max_size=6, unique=True))
    return links, replace(ThreadState(T, "ten", "t", 0, message_count=n),
                          head_seq=heads[0], tip_seqs=tuple(heads[1:]))


@given(_trees())
def test_each_branch_forks_at_the_newest_message_it_shares_with_the_current_one(
        tree: tuple[dict[int, Link], ThreadState]) -> None:
    """Against set arithmetic on the paths: the fork is the newest shared message, the
    first message of its own the oldest on its path only, the count its path's length."""
    links, state = tree
    current = set(path_oldest_first(state.head_seq, links.get))
    for branch in branches(state, links.get)[1:]:
        own_path = path_oldest_first(branch.seq, links.get)
        shared = current.intersection(own_path)
        own = [s for s in own_path if s not in current]
        assert branch.fork_seq == max(shared, default=-1)
        assert branch.first_seq == (min(own) if own else None)
        assert branch.message_count == len(own_path)
