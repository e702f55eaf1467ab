"""Regenerate, edit and switch branch: how a thread's history forks (the decide side).

Pure: `streams.core.thread.decide` calls `decide_branch_command`; the tree itself
(heads, tips, parent links) is `streams.core.branches`. The state holds no message,
so the shell looks up the message a regenerate or edit names and hands it in
(`Known.target_seq`, `.target_parent_seq`), as it does for a post's message id.

    RegenerateAnswer   RegenerateAccepted, [BranchSwitched to the user message],
                       RunAccepted, AttemptDispatched (a run of the same message,
                       named by the key: `ids.regenerate_run_id_for`)
    EditMessage        MessageAccepted (the new text, `parent_seq` the edited message's
                       parent), [BranchSwitched to it], RunAccepted, AttemptDispatched
    SwitchBranch       BranchSwitched

A switch is left out when the branch is current already (an edit of a message whose
parent is the head continues the branch). With a run active on the thread, a
regenerate or edit follows its `multitask_strategy` (docs/branches.md):

    reject     RunRejected(conflict)
    enqueue    queued behind the active run: MessageQueued with `branch` (a
               regenerate's also with `seq` and `run_id`; an edit's message is stored
               now, off the current branch); its branch becomes current when its run
               starts. A post enqueued behind a queued fork is a conflict.
    interrupt  RunCancelled(interrupted) first, then the fork; the cancelled run's
               partial answer still goes to the branch it ran on
    rollback   RunCancelled(rolled_back) first (its user message is tombstoned), then
               the fork

A regenerate of the message whose own run is the active one is a conflict under
every strategy: cancel that run first, or regenerate once it has ended (queued, a
rollback could remove the message; under interrupt, the cancelled run's partial
answer and the new answer would share one branch).

Refusals are `RunRejected` with the existing reasons (a new enum symbol would break
old readers): `unknown_thread`, `invalid` (bad ids or text, no such user message, a
tip that is not one), `duplicate` (the key or new message id already ran: the run
reported back), `payload_mismatch`, and `conflict` (a run active under `reject`, the
queue full, the message still queued, `Policy.max_branches` reached, a switch while
a run is active, a fork under interrupt or rollback while posts are queued, the
regenerate above). A SwitchBranch refused names no message: `message_id` "".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

from streams.core.branches import forks_left, head_of, is_own_run, stored_parent, with_rollback
from streams.core.domain import (
    AttemptDispatched,
    BranchSwitched,
    EditMessage,
    Event,
    Known,
    MessageAccepted,
    MessageQueued,
    MultitaskStrategy,
    Policy,
    RegenerateAccepted,
    RegenerateAnswer,
    RejectReason,
    RunAccepted,
    RunCancelled,
    RunRejected,
    SwitchBranch,
    ThreadState,
)
from streams.core.ids import regenerate_run_id_for, run_id_for, workflow_id_for
from streams.core.keys import key_conflict, payload_fingerprint, regenerate_fingerprint
from streams.core.reasons import CancelReason

__all__ = ["decide_branch_command"]

BranchCommand = RegenerateAnswer | EditMessage | SwitchBranch


@dataclass(frozen=True, slots=True)
class _Refusal:
    """Why a command is refused: its `RunRejected`, less what the command supplies."""

    reason: RejectReason
    detail: str
    run_id: str | None = None


def decide_branch_command(state: ThreadState | None, command: BranchCommand, policy: Policy,
                          known: Known) -> list[Event]:
    """The events of a regenerate, edit or branch switch on `state`."""
    if state is None or state.tenant != command.tenant or state.thread_id != command.thread_id:
        decided: list[Event] | _Refusal = _Refusal(RejectReason.UNKNOWN_THREAD, "no such thread")
    else:
        match command:
            case RegenerateAnswer():
                decided = _regenerate(state, command, policy, known)
            case EditMessage():
                decided = _edit(state, command, policy, known)
            case SwitchBranch():
                decided = _switch(state, command)
            case _:
                assert_never(command)
    if isinstance(decided, list):
        return decided
    message_id = command.new_message_id if isinstance(command, EditMessage) else \
        "" if isinstance(command, SwitchBranch) else command.message_id
    return [RunRejected(thread_id=command.thread_id, message_id=message_id,
                        reason=decided.reason, detail=decided.detail,
                        existing_run_id=decided.run_id, at_ms=command.now_ms)]


def _regenerate(state: ThreadState, command: RegenerateAnswer, policy: Policy,
                known: Known) -> list[Event] | _Refusal:
    refusal = (_bad_id("message_id", command.message_id, policy)
               or _bad_id("idempotency_key", command.idempotency_key, policy)
               or _key_used(state, command.idempotency_key,
                            regenerate_fingerprint(command.message_id), command.now_ms, policy))
    if refusal is not None:
        return refusal
    if known.message_run_id is not None:
        return _Refusal(RejectReason.DUPLICATE, "this regenerate already ran", known.message_run_id)
    target = _target(state, command.message_id, known)
    if isinstance(target, _Refusal):
        return target
    run_id = regenerate_run_id_for(state.thread_id, command.idempotency_key)
    accepted = RegenerateAccepted(thread_id=state.thread_id, message_id=command.message_id,
                                  seq=target, run_id=run_id,
                                  idempotency_key=command.idempotency_key, at_ms=command.now_ms)
    active = state.active_run
    strategy = command.multitask_strategy
    if active is not None and active.message_seq == target and is_own_run(state.thread_id, active):
        # Queued, a rollback (now or by a later post) could remove the message; under
        # interrupt, its own partial answer and the new one would share one branch.
        return _Refusal(RejectReason.CONFLICT, "the message's own run is still active: "
                        "cancel it, or regenerate once it has ended", active.run_id)
    if active is not None and strategy is MultitaskStrategy.ENQUEUE:
        refusal = _no_queue_room(state, policy) or _no_branch_room(state, policy, 1)
        if refusal is not None:
            return refusal
        return [accepted, MessageQueued(thread_id=state.thread_id, message_id=command.message_id,
                                        ahead=len(state.queued), at_ms=command.now_ms,
                                        seq=target, run_id=run_id, branch=True,
                                        parent_seq=stored_parent(target, known.target_parent_seq))]
    cancelled = _cancel_active(state, strategy, command.now_ms)
    if isinstance(cancelled, _Refusal):
        return cancelled
    events, head = cancelled
    if target != head:
        refusal = _no_branch_room(state, policy, 0 if target in state.tip_seqs else 1)
        if refusal is not None:
            return refusal
        events.append(BranchSwitched(thread_id=state.thread_id, seq=target, at_ms=command.now_ms))
    return [accepted, *events, *_run(state, run_id, command.message_id, command.now_ms,
                                     stored_parent(target, known.target_parent_seq))]


def _edit(state: ThreadState, command: EditMessage, policy: Policy,
          known: Known) -> list[Event] | _Refusal:
    refusal = (_bad_id("message_id", command.message_id, policy)
               or _bad_id("new_message_id", command.new_message_id, policy)
               or (_bad_id("idempotency_key", command.idempotency_key, policy)
                   if command.idempotency_key is not None else None)
               or _bad_text(command.text, policy)
               or _key_used(state, command.idempotency_key, payload_fingerprint(command.text),
                            command.now_ms, policy))
    if refusal is not None:
        return refusal
    existing = known.message_run_id
    if existing is None and command.new_message_id in state.rolled_back:
        existing = run_id_for(state.thread_id, command.new_message_id)
    if existing is not None:
        return _Refusal(RejectReason.DUPLICATE, "message id already has a run", existing)
    target = _target(state, command.message_id, known)
    if isinstance(target, _Refusal):
        return target
    parent, seq = known.target_parent_seq, state.message_count
    run = _run(state, run_id_for(state.thread_id, command.new_message_id),
               command.new_message_id, command.now_ms, stored_parent(seq, parent))

    def accepted(parent_seq: int | None) -> MessageAccepted:
        return MessageAccepted(thread_id=state.thread_id, message_id=command.new_message_id,
                               text=command.text, idempotency_key=command.idempotency_key,
                               at_ms=command.now_ms, parent_seq=parent_seq)

    if state.active_run is not None and command.multitask_strategy is MultitaskStrategy.ENQUEUE:
        refusal = _no_queue_room(state, policy) or _no_branch_room(state, policy, 1)
        if refusal is not None:
            return refusal
        # Stored now, off the current branch: the active run's answer still comes there.
        return [accepted(parent), MessageQueued(
            thread_id=state.thread_id, message_id=command.new_message_id, ahead=len(state.queued),
            at_ms=command.now_ms, branch=True, parent_seq=stored_parent(seq, parent))]
    cancelled = _cancel_active(state, command.multitask_strategy, command.now_ms)
    if isinstance(cancelled, _Refusal):
        return cancelled
    events, head = cancelled
    if parent == head:  # the edited message's parent is the head: the branch goes on
        return [*events, accepted(None), *run]
    refusal = _no_branch_room(state, policy, 1)
    if refusal is not None:
        return refusal
    return [*events, accepted(parent),
            BranchSwitched(thread_id=state.thread_id, seq=seq, at_ms=command.now_ms), *run]


def _switch(state: ThreadState, command: SwitchBranch) -> list[Event] | _Refusal:
    if command.seq == head_of(state):
        return []  # current already: an idempotent repeat
    if command.seq not in state.tip_seqs:
        return _Refusal(RejectReason.INVALID, f"message {command.seq} is not the head of a branch")
    if state.active_run is not None:
        return _Refusal(RejectReason.CONFLICT, "a run is active on the thread: switch branches "
                        "once it has ended", state.active_run.run_id)
    return [BranchSwitched(thread_id=state.thread_id, seq=command.seq, at_ms=command.now_ms)]


# --- the parts ---------------------------------------------------------------------


def _bad_id(name: str, value: str, policy: Policy) -> _Refusal | None:
    if 1 <= len(value) <= policy.max_id_chars:
        return None
    return _Refusal(RejectReason.INVALID, f"{name} must be 1 to {policy.max_id_chars} characters")


def _bad_text(text: str, policy: Policy) -> _Refusal | None:
    if not text.strip():
        return _Refusal(RejectReason.INVALID, "text is empty")
    if len(text) > policy.max_input_chars:
        return _Refusal(RejectReason.INVALID, f"text has {len(text)} characters, "
                        f"the limit is {policy.max_input_chars}")
    return None


def _key_used(state: ThreadState, key: str | None, fingerprint: str, now_ms: int,
              policy: Policy) -> _Refusal | None:
    used = key_conflict(state, key, fingerprint, now_ms, policy)
    return None if used is None else _Refusal(*used)


def _target(state: ThreadState, message_id: str, known: Known) -> int | _Refusal:
    """The seq of the stored user message `message_id`, which must have run already."""
    if known.target_seq < 0:
        return _Refusal(RejectReason.INVALID, f"no user message {message_id!r} on the thread")
    if any(q.message_id == message_id and q.run_id is None for q in state.queued):
        return _Refusal(RejectReason.CONFLICT, f"message {message_id!r} is queued: it has "
                        "not been answered yet")
    return known.target_seq


def _no_queue_room(state: ThreadState, policy: Policy) -> _Refusal | None:
    if len(state.queued) < policy.max_queued_messages:
        return None
    return _Refusal(RejectReason.CONFLICT, f"the thread already has {len(state.queued)} messages "
                    "queued, the limit", state.active_run.run_id if state.active_run else None)


def _no_branch_room(state: ThreadState, policy: Policy, new_branches: int) -> _Refusal | None:
    if forks_left(state, policy.max_branches) >= new_branches:
        return None
    return _Refusal(RejectReason.CONFLICT, f"the thread has {policy.max_branches} branches "
                    "(those of queued regenerates included), the limit")


def _cancel_active(state: ThreadState, strategy: MultitaskStrategy,
                   now_ms: int) -> tuple[list[Event], int] | _Refusal:
    """The cancellation a fork makes of the active run under `strategy` (enqueue is
    the callers'), and the head of the current branch after it."""
    active = state.active_run
    if active is None:
        return [], head_of(state)
    match strategy:
        case MultitaskStrategy.REJECT | MultitaskStrategy.ENQUEUE:
            return _Refusal(RejectReason.CONFLICT, "another run is active on the thread",
                            active.run_id)
        case _ if any(not q.branch for q in state.queued):
            # They wait on the current branch; a fork now would leave them behind.
            return _Refusal(RejectReason.CONFLICT, "messages are queued on the current branch: "
                            "regenerate or edit with enqueue, or once they have run",
                            active.run_id)
        case MultitaskStrategy.INTERRUPT:
            reason, head = CancelReason.INTERRUPTED, head_of(state)
        case MultitaskStrategy.ROLLBACK:
            reason, head = CancelReason.ROLLED_BACK, head_of(with_rollback(state, active))
        case _:
            assert_never(strategy)
    return [RunCancelled(thread_id=state.thread_id, run_id=active.run_id, reason=reason,
                         at_ms=now_ms)], head


def _run(state: ThreadState, run_id: str, message_id: str, now_ms: int,
         parent_seq: int | None) -> list[Event]:
    return [RunAccepted(thread_id=state.thread_id, run_id=run_id,
                        workflow_id=workflow_id_for(state.thread_id), message_id=message_id,
                        at_ms=now_ms, parent_seq=parent_seq),
            AttemptDispatched(thread_id=state.thread_id, run_id=run_id, message_id=message_id,
                              attempt=1, at_ms=now_ms)]
