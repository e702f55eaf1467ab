"""Regenerate, edit and switch branch (`streams.core.forks` through `decide`): given
events, when a command, then events, for each multitask strategy (docs/branches.md).

The thread below: m-1 (seq 0) answered (seq 1), then m-2 (seq 2) running as run 2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest

from streams.core.branches import head_of
from streams.core.domain import (
    AttemptDispatched,
    BranchSwitched,
    Command,
    EditMessage,
    Event,
    Known,
    MessageAccepted,
    MessageQueued,
    MultitaskStrategy,
    Policy,
    PostUserMessage,
    RegenerateAccepted,
    RegenerateAnswer,
    RejectReason,
    RunAccepted,
    RunCancelled,
    SwitchBranch,
    ThreadState,
)
from streams.core.history import MessagePut, MessageRemoved, RunStatusChanged, history_writes
from streams.core.ids import regenerate_run_id_for, run_id_for
from streams.core.reasons import CancelReason
from streams.core.thread import apply, decide, initial_state
from tests.streams.test_thread import (
    POLICY,
    RUN1,
    RUN2,
    TENANT,
    T,
    accepted,
    complete,
    completed_event,
    created,
    queued_event,
    rejected,
)

REJECT, ENQUEUE, INTERRUPT, ROLLBACK = MultitaskStrategy
REGEN = regenerate_run_id_for(T, "k")
EDIT = run_id_for(T, "m-1e")
ANSWERED = [created(), *accepted("m-1"), completed_event()]  # seq 0 and 1
RUNNING = [*ANSWERED, *accepted("m-2", at=2_000)]  # m-2 at seq 2, run 2 active
M1 = Known(target_seq=0, target_parent_seq=-1)  # what the history table knows of m-1
M2 = Known(target_seq=2, target_parent_seq=1)
NOW = 3_000


NOTHING = Known()


def when(history: Iterable[Event], command: Command, known: Known = NOTHING,
         policy: Policy = POLICY) -> tuple[list[Event], ThreadState]:
    """The events `command` decides after `history`, and the state after them."""
    state = apply(initial_state(), history, policy)
    events = decide(state, command, policy, known)
    after = apply(state, events, policy)
    assert after is not None
    return events, after


def regenerate(message_id: str = "m-1", strategy: MultitaskStrategy = REJECT, key: str = "k",
               now: int = NOW) -> RegenerateAnswer:
    """The command that answers `message_id` again under idempotency key `key`."""
    return RegenerateAnswer(T, TENANT, message_id, key, now, strategy)


def edit(message_id: str = "m-1", strategy: MultitaskStrategy = REJECT,
         new_id: str = "m-1e", text: str = "hello, edited", now: int = NOW) -> EditMessage:
    """The command that posts `text` as `new_id` in place of `message_id`."""
    return EditMessage(T, TENANT, message_id, new_id, text, None, now, strategy)


def run_started(run_id: str, message_id: str, parent_seq: int | None = None,
                now: int = NOW) -> list[Event]:
    """RunAccepted and its first dispatch."""
    return [RunAccepted(T, run_id, f"agent-{T}", message_id, now, parent_seq),
            AttemptDispatched(T, run_id, message_id, 1, now)]


def regenerate_accepted(now: int = NOW) -> RegenerateAccepted:
    """The event of the regenerate of m-1 under key k."""
    return RegenerateAccepted(T, "m-1", 0, REGEN, "k", now)


def cancelled(reason: str, run_id: str = RUN2, now: int = NOW) -> RunCancelled:
    """The event of run 2 cancelled by a double text."""
    return RunCancelled(T, run_id, reason, now)


# --- with no run active --------------------------------------------------------------


def test_a_regenerate_answers_the_message_again_on_a_branch_from_it() -> None:
    """The head moves to the user message, the answer after it becomes a tip, and the
    keyed run answers it; the answer is stored with the message as its parent."""
    events, state = when(ANSWERED, regenerate(), M1)
    assert events == [regenerate_accepted(), BranchSwitched(T, 0, NOW), *run_started(REGEN, "m-1")]
    assert head_of(state) == 0 and state.tip_seqs == (1,)
    assert state.active_run is not None and state.active_run.message_seq == 0
    writes = history_writes(state, completed_event(run_id=REGEN))
    assert isinstance(writes[0], MessagePut) and writes[0].seq == 2 and writes[0].parent_seq == 0
    assert not any(isinstance(w, RunStatusChanged) for w in writes)  # m-1's record is its own run's


def test_an_edit_is_a_new_message_beside_the_one_edited() -> None:
    """The edited message is stored at the next seq with the edited one's parent, and
    becomes the head; the branch it leaves is a tip."""
    events, state = when(ANSWERED, edit(), M1)
    assert events == [MessageAccepted(T, "m-1e", "hello, edited", None, NOW, parent_seq=-1),
                      BranchSwitched(T, 2, NOW), *run_started(EDIT, "m-1e", parent_seq=-1)]
    assert head_of(state) == 2 and state.tip_seqs == (1,)


def test_an_edit_whose_parent_is_the_head_continues_the_branch() -> None:
    """Editing a message whose parent is the current head needs no new branch."""
    history = [*ANSWERED, *when(ANSWERED, regenerate(), M1)[0]]  # head: m-1, run going
    history.append(completed_event(run_id=REGEN, at=4_000))  # its answer: seq 2, head
    events, state = when(history, edit("m-x", new_id="m-y"), Known(target_seq=9, target_parent_seq=2))
    assert events == [MessageAccepted(T, "m-y", "hello, edited", None, NOW),
                      *run_started(run_id_for(T, "m-y"), "m-y")]
    assert state.tip_seqs == (1,)


def test_a_switch_makes_a_tip_current_and_keeps_the_head_it_leaves() -> None:
    """SwitchBranch to a tip: BranchSwitched; again: nothing; to anything else: invalid."""
    history = [*ANSWERED, *when(ANSWERED, regenerate(), M1)[0],
               completed_event(run_id=REGEN, at=4_000)]  # tips (1,), head 2
    events, state = when(history, SwitchBranch(T, TENANT, 1, NOW))
    assert events == [BranchSwitched(T, 1, NOW)]
    assert head_of(state) == 1 and state.tip_seqs == (2,)
    assert when(history, SwitchBranch(T, TENANT, 2, NOW))[0] == []  # current already
    assert when(history, SwitchBranch(T, TENANT, 0, NOW))[0] == [
        rejected(RejectReason.INVALID, None, "", NOW)]
    assert when(history, SwitchBranch(T, "other", 1, NOW))[0] == [
        rejected(RejectReason.UNKNOWN_THREAD, None, "", NOW)]


def test_a_switch_while_a_run_is_active_is_a_conflict() -> None:
    """The running answer must land on its own branch: switch once it has ended."""
    history = [*ANSWERED, *when(ANSWERED, regenerate(), M1)[0]]  # tips (1,), run going
    assert when(history, SwitchBranch(T, TENANT, 1, NOW))[0] == [
        rejected(RejectReason.CONFLICT, REGEN, "", NOW)]


@pytest.mark.parametrize("command", [regenerate(), edit()], ids=["regenerate", "edit"])
def test_a_fork_past_max_branches_is_a_conflict(command: Command) -> None:
    """Policy.max_branches counts the current branch: at 1, no fork is allowed."""
    events, _ = when(ANSWERED, command, M1, replace(POLICY, max_branches=1))
    message_id = "m-1e" if isinstance(command, EditMessage) else "m-1"
    assert events == [rejected(RejectReason.CONFLICT, None, message_id, NOW)]
    assert "1 branches" in events[0].detail  # type: ignore[union-attr]


def test_a_regenerate_or_edit_of_no_stored_user_message_is_invalid() -> None:
    """The history table knows no such user message (never posted, or rolled back)."""
    assert when(ANSWERED, regenerate("nope"))[0] == [rejected(RejectReason.INVALID, None, "nope", NOW)]
    assert when(ANSWERED, edit("nope"))[0] == [rejected(RejectReason.INVALID, None, "m-1e", NOW)]


def test_an_edit_is_checked_like_a_post() -> None:
    """Empty text is invalid; a new message id that already ran is a duplicate."""
    assert when(ANSWERED, edit(text=" "), M1)[0] == [rejected(RejectReason.INVALID, None, "m-1e", NOW)]
    known = replace(M1, message_run_id=EDIT)
    assert when(ANSWERED, edit(), known)[0] == [rejected(RejectReason.DUPLICATE, EDIT, "m-1e", NOW)]


def test_an_edit_sent_twice_with_its_key_runs_once() -> None:
    """An edit's key works as a post's: the same edit again is a duplicate naming the
    first run, whatever the strategy; the key with other text a payload mismatch."""
    keyed = EditMessage(T, TENANT, "m-1", "m-1e", "hello, edited", "ek", NOW)
    history = [*ANSWERED, *when(ANSWERED, keyed, M1)[0]]
    for strategy in MultitaskStrategy:
        again = replace(keyed, now_ms=NOW + 1, multitask_strategy=strategy)
        assert when(history, again, M1)[0] == [
            rejected(RejectReason.DUPLICATE, EDIT, "m-1e", NOW + 1)]
    other = replace(keyed, text="other", new_message_id="m-1f", now_ms=NOW + 1)
    assert when(history, other, M1)[0] == [
        rejected(RejectReason.PAYLOAD_MISMATCH, EDIT, "m-1f", NOW + 1)]


def test_a_regenerate_sent_twice_is_a_duplicate_naming_its_run() -> None:
    """The key is kept with the message it regenerated: the same again is a duplicate,
    the key for another message a payload mismatch; the shell's record of the run
    (Known.message_run_id) makes it a duplicate whatever the key's age."""
    history = [*ANSWERED, *when(ANSWERED, regenerate(), M1)[0]]
    assert when(history, regenerate(now=NOW + 1), M1)[0] == [
        rejected(RejectReason.DUPLICATE, REGEN, "m-1", NOW + 1)]
    assert when(history, regenerate("m-2", now=NOW + 1), M2)[0] == [
        rejected(RejectReason.PAYLOAD_MISMATCH, REGEN, "m-2", NOW + 1)]
    assert when(ANSWERED, regenerate(), replace(M1, message_run_id=REGEN))[0] == [
        rejected(RejectReason.DUPLICATE, REGEN, "m-1", NOW)]


# --- while a run is active: each multitask strategy ------------------------------


@pytest.mark.parametrize("command", [regenerate(), edit()], ids=["regenerate", "edit"])
def test_reject_refuses_a_fork_while_a_run_is_active(command: Command) -> None:
    """reject (the default): a conflict naming the active run; nothing else changes."""
    events, state = when(RUNNING, command, M1)
    message_id = "m-1e" if isinstance(command, EditMessage) else "m-1"
    assert events == [rejected(RejectReason.CONFLICT, RUN2, message_id, NOW)]
    assert state == apply(initial_state(), RUNNING, POLICY)


def test_enqueue_queues_a_regenerate_whose_branch_becomes_current_when_it_starts() -> None:
    """enqueue: the key is recorded and the regenerate queued (its message, seq and
    run); when run 2 ends, its answer goes on run 2's branch, then the switch and the run."""
    events, state = when(RUNNING, regenerate(strategy=ENQUEUE), M1)
    assert events == [regenerate_accepted(),
                      MessageQueued(T, "m-1", 0, NOW, seq=0, run_id=REGEN, branch=True)]
    assert state.active_run is not None and state.active_run.run_id == RUN2
    events, state = when([*RUNNING, *events], complete(run_id=RUN2, now=4_000))
    assert events == [completed_event(run_id=RUN2, at=4_000), BranchSwitched(T, 0, 4_000),
                      *run_started(REGEN, "m-1", now=4_000)]
    assert head_of(state) == 0 and state.tip_seqs == (3,) and state.queued == ()


def test_enqueue_stores_an_edit_off_the_current_branch_and_switches_when_it_starts() -> None:
    """enqueue: the edited message is stored now, as a branch of its own; run 2's answer
    still follows m-2; then the edit's branch becomes current and it runs."""
    events, state = when(RUNNING, edit(strategy=ENQUEUE), M1)
    assert events == [MessageAccepted(T, "m-1e", "hello, edited", None, NOW, parent_seq=-1),
                      MessageQueued(T, "m-1e", 0, NOW, branch=True, parent_seq=-1)]
    assert head_of(state) == 2 and state.tip_seqs == (3,)
    history = [*RUNNING, *events]
    answer = history_writes(state, completed_event(run_id=RUN2, at=4_000))[0]
    assert isinstance(answer, MessagePut) and (answer.seq, answer.parent_seq) == (4, 2)
    events, state = when(history, complete(run_id=RUN2, now=4_000))
    assert events == [completed_event(run_id=RUN2, at=4_000), BranchSwitched(T, 3, 4_000),
                      *run_started(EDIT, "m-1e", parent_seq=-1, now=4_000)]
    assert head_of(state) == 3 and state.tip_seqs == (4,)


def test_a_post_enqueued_behind_a_queued_fork_is_a_conflict() -> None:
    """It would wait on the branch the fork leaves; post once the fork's run started."""
    history = [*RUNNING, *when(RUNNING, regenerate(strategy=ENQUEUE), M1)[0]]
    post = PostUserMessage(T, TENANT, "m-3", "and?", None, NOW + 1, ENQUEUE)
    assert when(history, post)[0] == [rejected(RejectReason.CONFLICT, RUN2, "m-3", NOW + 1)]


def test_interrupt_cancels_the_run_and_its_partial_answer_stays_on_its_branch() -> None:
    """interrupt: run 2 is cancelled (interrupted), the fork runs; run 2's partial
    answer, reported later, is stored after m-2, on the branch left behind."""
    events, state = when(RUNNING, regenerate(strategy=INTERRUPT), M1)
    assert events == [regenerate_accepted(), cancelled(CancelReason.INTERRUPTED),
                      BranchSwitched(T, 0, NOW), *run_started(REGEN, "m-1")]
    assert state.interrupted is not None and state.interrupted_tip_seq == 2
    history = [*RUNNING, *events]
    events, after = when(history, complete(run_id=RUN2, now=4_000))
    (partial,) = events
    put = history_writes(state, partial)[0]
    assert isinstance(put, MessagePut) and (put.seq, put.parent_seq) == (3, None)  # after m-2
    assert head_of(after) == 0 and after.tip_seqs == (3,) and after.interrupted_tip_seq == -1


def test_an_edit_under_interrupt_forks_after_the_cancel() -> None:
    """interrupt: the cancel first, then the edited message, the switch and its run."""
    events, _ = when(RUNNING, edit(strategy=INTERRUPT), M1)
    assert events == [cancelled(CancelReason.INTERRUPTED),
                      MessageAccepted(T, "m-1e", "hello, edited", None, NOW, parent_seq=-1),
                      BranchSwitched(T, 3, NOW), *run_started(EDIT, "m-1e", parent_seq=-1)]


def test_rollback_removes_the_running_message_and_forks() -> None:
    """rollback: run 2 is cancelled and m-2 tombstoned; the head goes back to m-2's
    parent, which stays a tip; the regenerate's branch becomes current."""
    events, state = when(RUNNING, regenerate(strategy=ROLLBACK), M1)
    assert events == [regenerate_accepted(), cancelled(CancelReason.ROLLED_BACK),
                      BranchSwitched(T, 0, NOW), *run_started(REGEN, "m-1")]
    before = apply(initial_state(), [*RUNNING, regenerate_accepted()], POLICY)
    assert history_writes(before, events[1]) == [MessageRemoved(2)]
    assert head_of(state) == 0 and state.tip_seqs == (1,)


def test_an_edit_of_the_running_message_under_rollback_replaces_it() -> None:
    """rollback: editing the very message whose run is rolled back takes its place on
    the same branch: no new branch."""
    events, state = when(RUNNING, edit("m-2", ROLLBACK), M2)
    assert events == [cancelled(CancelReason.ROLLED_BACK),
                      MessageAccepted(T, "m-1e", "hello, edited", None, NOW),
                      *run_started(EDIT, "m-1e", parent_seq=1)]
    assert state.tip_seqs == () and head_of(state) == 3


@pytest.mark.parametrize("strategy", list(MultitaskStrategy))
def test_a_regenerate_of_the_running_message_is_a_conflict(strategy: MultitaskStrategy) -> None:
    """m-2's own run is active: cancel it, or regenerate once it has ended (a rollback
    could remove the message; an interrupt would put two answers on one branch)."""
    assert when(RUNNING, regenerate("m-2", strategy), M2)[0] == [
        rejected(RejectReason.CONFLICT, RUN2, "m-2", NOW)]


def test_rolling_back_a_regenerate_removes_no_message() -> None:
    """A regenerate's run shares its user message with the message's own run: a
    rollback cancels it and tombstones nothing; its end rewrites no record."""
    history = [*ANSWERED, *when(ANSWERED, regenerate(), M1)[0]]
    state = apply(initial_state(), history, POLICY)
    assert history_writes(state, RunCancelled(T, REGEN, CancelReason.ROLLED_BACK, NOW)) == []
    post = PostUserMessage(T, TENANT, "m-3", "instead", None, NOW, ROLLBACK)
    events, after = when(history, post)
    assert events[:2] == [MessageAccepted(T, "m-3", "instead", None, NOW),
                          cancelled(CancelReason.ROLLED_BACK, REGEN)]
    assert after.active_run is not None and after.active_run.message_seq == 2


@pytest.mark.parametrize("strategy", [INTERRUPT, ROLLBACK])
def test_a_fork_that_would_leave_queued_posts_behind_is_a_conflict(
        strategy: MultitaskStrategy) -> None:
    """Posts queued on the current branch would run on a branch no longer current."""
    history = [*RUNNING, *queued_event("m-3", at=2_500)]
    assert when(history, regenerate(strategy=strategy), M1)[0] == [
        rejected(RejectReason.CONFLICT, RUN2, "m-1", NOW)]


def test_a_regenerate_of_a_queued_message_is_a_conflict() -> None:
    """A queued message has not been answered yet."""
    history = [*RUNNING, *queued_event("m-3", at=2_500)]
    known = Known(target_seq=3, target_parent_seq=2)
    assert when(history, regenerate("m-3", ENQUEUE), known)[0] == [
        rejected(RejectReason.CONFLICT, None, "m-3", NOW)]


def test_a_rollback_post_on_an_edited_branch_takes_the_edited_message_s_place() -> None:
    """The rolled-back message was an edit (a root): the new message follows the edit's
    parent, not the seq before it, so the cancel comes first."""
    forked = [*ANSWERED, *when(ANSWERED, edit(), M1)[0]]  # m-1e at seq 2, a root, running
    post = PostUserMessage(T, TENANT, "m-3", "instead", None, NOW + 1, ROLLBACK)
    events, state = when(forked, post)
    assert events == [cancelled(CancelReason.ROLLED_BACK, EDIT, NOW + 1),
                      MessageAccepted(T, "m-3", "instead", None, NOW + 1),
                      *run_started(run_id_for(T, "m-3"), "m-3", parent_seq=-1, now=NOW + 1)]
    before = apply(initial_state(), [*forked, events[0]], POLICY)
    put = history_writes(before, events[1])[0]
    assert isinstance(put, MessagePut) and (put.seq, put.parent_seq) == (3, -1)
    assert state.tip_seqs == (1,)


def test_a_regenerate_s_run_is_its_own() -> None:
    """The regenerate's run id is derived from its key: never a message's run."""
    assert REGEN not in (RUN1, RUN2, run_id_for(T, "k"))
    assert regenerate_run_id_for(T, "k") == REGEN != regenerate_run_id_for("t-2", "k")
