"""The per-thread decider: pure `decide` and `evolve` over `streams.core.domain`.

`decide(state, command, policy)` turns a command into events; `evolve(state, event)`
folds one event into the state. Neither does I/O, reads the clock or draws random
numbers: time arrives as `now_ms` in the command and ids are derived with uuid5, so
a recorded command log always replays to the same events.

A business rejection is a `RunRejected` event; a command that changes nothing (an
idempotent repeat, a stale or redelivered worker report) decides no events.
Worker reports are fenced by the attempt number: only reports naming the active run
and its current, still live attempt are acted on.

Double-texting (`PostUserMessage.multitask_strategy`, docs/multitask.md): a post
while a run is active is rejected (`reject`, the default), queued behind it
(`enqueue`: `MessageAccepted`, `MessageQueued`), or cancels it and runs
(`interrupt` and `rollback`: `MessageAccepted`, `RunCancelled` with reason
`CancelReason.INTERRUPTED` or `ROLLED_BACK`, `RunAccepted`, `AttemptDispatched`). Whatever ends
a run, the same decision starts the oldest queued message's run, so at most one
run is active and queued messages run once each, in order: the queue is part of
the state, committed with the decision that changes it.

Branches (issue #30, docs/branches.md): `RegenerateAnswer`, `EditMessage` and
`SwitchBranch` are decided by `streams.core.forks`; `evolve` keeps the current
branch's head and the other branches' tips with `streams.core.branches`. A post
continues the current branch; on a thread that never branched the head is simply
the newest message, and every event and state is what it was before branches.

`evolve` is total: an event that does not apply to the state (which `decide` never
produces) leaves the state unchanged. States are never mutated in place; mappings
are rebuilt and wrapped read-only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import assert_never

from streams.core.branches import (
    head_of,
    stored_parent,
    with_branch_switched,
    with_message_stored,
    with_rollback,
)
from streams.core.copies import (
    decide_copy,
    decide_import,
    refuse_while_importing,
    with_history_imported,
)
from streams.core.domain import (
    NOTHING_KNOWN,
    ActiveRun,
    AssistantMessage,
    AttemptDispatched,
    AttemptStarted,
    BranchSwitched,
    CancelRun,
    CheckDeadlines,
    Command,
    CopyThread,
    CreateThread,
    DeleteThread,
    EditMessage,
    Event,
    ExecutionStarted,
    HeartbeatRecorded,
    HistoryImported,
    IdempotencyRecord,
    ImportHistory,
    Known,
    MessageAccepted,
    MessageQueued,
    MultitaskStrategy,
    PartialAnswerStored,
    Policy,
    PostUserMessage,
    QueuedMessage,
    RegenerateAccepted,
    RegenerateAnswer,
    RejectReason,
    ReportAttemptCompleted,
    ReportAttemptFailed,
    ReportAttemptStarted,
    ReportExecutionStarted,
    ReportHeartbeat,
    ReportStepCompleted,
    ResumeRun,
    RetryScheduled,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunInterrupted,
    RunRecord,
    RunRejected,
    RunStatus,
    StepRecorded,
    SwitchBranch,
    ThreadCopied,
    ThreadCreated,
    ThreadDeleted,
    ThreadState,
    WorkerReport,
)
from streams.core.forks import decide_branch_command
from streams.core.ids import answer_message_id_for, run_id_for, workflow_id_for
from streams.core.interrupts import (
    interrupt_deadline_ms,
    interrupted,
    on_interrupted,
    reported_interrupt,
    resume_run,
    timed_out,
)
from streams.core.journal import INTERRUPT, admit
from streams.core.keys import (
    bounded_keys,
    key_conflict,
    payload_fingerprint,
    regenerate_fingerprint,
)
from streams.core.reasons import CancelReason, FailureCode

__all__ = [
    "OUTPUT_TOO_LARGE",
    "apply",
    "decide",
    "evolve",
    "initial_state",
    "next_deadline_ms",
    "output_bytes",
    "payload_fingerprint",
]

_DEFAULT_POLICY = Policy()

_LIVE = frozenset({RunStatus.DISPATCHED, RunStatus.RUNNING})
_DOUBLE_TEXT = frozenset({CancelReason.INTERRUPTED, CancelReason.ROLLED_BACK})

_RunEvent = (
    AttemptDispatched
    | AttemptStarted
    | HeartbeatRecorded
    | RetryScheduled
    | RunCompleted
    | RunFailed
    | RunCancelled
    | StepRecorded
    | RunInterrupted
    | ExecutionStarted
)

# The worker's name for it (streams/worker/execution.py imports it from here).
OUTPUT_TOO_LARGE = FailureCode.OUTPUT_TOO_LARGE


# --- the decider ---------------------------------------------------------------


def initial_state() -> ThreadState | None:
    """The state before any event: the thread does not exist."""
    return None


def decide(state: ThreadState | None, command: Command, policy: Policy,
           known: Known = NOTHING_KNOWN) -> list[Event]:
    """The events `command` causes on `state`; never raises, never mutates.

    `known` carries what the shell looked up in the thread's stored history for this
    command (see `Known`); the default knows nothing.

    Whenever the events leave the thread with no active run and messages queued,
    they end with the oldest queued message's `RunAccepted` and `AttemptDispatched`."""
    if state is not None and state.import_parts_left:
        refused = refuse_while_importing(state, command)
        if refused is not None:
            return refused
    match command:
        case CreateThread():
            return _create_thread(state, command, policy)
        case CopyThread():
            return decide_copy(state, command, policy, known)
        case ImportHistory():
            return decide_import(state, command, policy)
        case PostUserMessage():
            events = _post_user_message(state, command, policy, known)
        case CancelRun():
            events = _cancel_run(state, command)
        case DeleteThread():
            return _delete_thread(state, command)
        case CheckDeadlines():
            events = _check_deadlines(state, command, policy)
        case ResumeRun():
            events = resume_run(state, command, policy)
        case RegenerateAnswer() | EditMessage() | SwitchBranch():
            events = decide_branch_command(state, command, policy, known)
        case _:
            # mypy narrows what is left to the four worker reports.
            events = _worker_report(state, command, policy)
    return _start_queued(state, events, policy) if events else events


def evolve(state: ThreadState | None, event: Event, policy: Policy = _DEFAULT_POLICY) -> \
        ThreadState | None:
    """The state after `event`; returns a new state and leaves `state` untouched.

    `policy` bounds the idempotency keys kept (`idempotency_window_ms`,
    `max_idempotency_keys`): fold with the policy the events were decided with."""
    if isinstance(event, ThreadCreated):
        if state is not None:
            return state
        return ThreadState(
            thread_id=event.thread_id,
            tenant=event.tenant,
            title=event.title,
            created_at_ms=event.at_ms,
            updated_at_ms=event.at_ms,
        )
    if state is None or isinstance(event, RunRejected):
        return state
    if isinstance(event, ThreadDeleted):
        return None
    if isinstance(event, MessageAccepted):
        return _message_accepted(state, event, policy)
    if isinstance(event, RunAccepted):
        return _run_accepted(state, event)
    if isinstance(event, MessageQueued):
        return _message_queued(state, event)
    if isinstance(event, PartialAnswerStored):
        # The interrupted run's branch: the current one, unless another became current.
        head, tip = head_of(state), state.interrupted_tip_seq
        parent = tip if tip >= 0 else head
        stored = with_message_stored(state, parent, on_branch=parent == head)
        return replace(stored, interrupted=None, interrupted_tip_seq=-1,
                       updated_at_ms=event.at_ms)
    if isinstance(event, RegenerateAccepted):
        record = IdempotencyRecord(message_id=event.message_id, run_id=event.run_id,
                                   payload_fingerprint=regenerate_fingerprint(event.message_id),
                                   at_ms=event.at_ms)
        return replace(state, updated_at_ms=event.at_ms, idempotency=bounded_keys(
            state.idempotency, event.idempotency_key, record, policy))
    if isinstance(event, HistoryImported):
        return with_history_imported(state, event)
    if isinstance(event, ThreadCopied):
        return state
    if isinstance(event, BranchSwitched):
        return replace(with_branch_switched(state, event.seq), updated_at_ms=event.at_ms)
    return _run_event(state, event, policy)


def apply(state: ThreadState | None, events: Iterable[Event],
          policy: Policy = _DEFAULT_POLICY) -> ThreadState | None:
    """Fold `evolve` over `events`."""
    for event in events:
        state = evolve(state, event, policy)
    return state


def next_deadline_ms(state: ThreadState | None, policy: Policy) -> int | None:
    """The earliest `now_ms` at which `CheckDeadlines` decides events, or None.

    A tick at exactly this time fires; a tick one millisecond earlier decides nothing.
    """
    run = state.active_run if state is not None else None
    if run is None:
        return None
    if run.status in _LIVE:
        return min(
            run.last_heartbeat_ms + policy.heartbeat_timeout_ms + 1,
            run.attempt_started_ms + policy.attempt_timeout_ms + 1,
        )
    if interrupted(run):
        return interrupt_deadline_ms(run, policy)
    if run.status is RunStatus.RETRY_WAIT:
        return run.retry_due_ms
    return None


# --- decide, per command -------------------------------------------------------


def _create_thread(state: ThreadState | None, command: CreateThread, policy: Policy) -> list[Event]:
    # An id past the limit would be copied into every record of the thread; the
    # gateway never makes one, so only a producer writing to Kafka directly can.
    if state is not None or len(command.thread_id) > policy.max_id_chars:
        return []
    return [
        ThreadCreated(
            thread_id=command.thread_id,
            tenant=command.tenant,
            title=command.title[: policy.max_title_chars],
            at_ms=command.now_ms,
        )
    ]


def _delete_thread(state: ThreadState | None, command: DeleteThread) -> list[Event]:
    if state is None or state.tenant != command.tenant:
        return []
    events: list[Event] = []
    if state.active_run is not None:
        events.append(RunCancelled(thread_id=state.thread_id, run_id=state.active_run.run_id,
                                   reason=CancelReason.THREAD_DELETED, at_ms=command.now_ms))
    events.append(ThreadDeleted(thread_id=state.thread_id, tenant=state.tenant,
                                message_count=state.message_count, at_ms=command.now_ms))
    return events


def _post_user_message(
    state: ThreadState | None, command: PostUserMessage, policy: Policy, known: Known
) -> list[Event]:
    def reject(reason: RejectReason, detail: str, existing_run_id: str | None) -> list[Event]:
        return [
            RunRejected(
                thread_id=command.thread_id,
                message_id=command.message_id,
                reason=reason,
                detail=detail,
                existing_run_id=existing_run_id,
                at_ms=command.now_ms,
            )
        ]

    if state is None or state.tenant != command.tenant or state.thread_id != command.thread_id:
        return reject(RejectReason.UNKNOWN_THREAD, "no such thread", None)
    if not command.text.strip():
        return reject(RejectReason.INVALID, "text is empty", None)
    if len(command.text) > policy.max_input_chars:
        return reject(
            RejectReason.INVALID,
            f"text has {len(command.text)} characters, the limit is {policy.max_input_chars}",
            None,
        )
    if len(command.message_id) > policy.max_id_chars or not command.message_id:
        return reject(RejectReason.INVALID, f"message_id must be 1 to {policy.max_id_chars} characters",
                      None)
    if command.idempotency_key is not None and len(command.idempotency_key) > policy.max_id_chars:
        return reject(RejectReason.INVALID,
                      f"idempotency_key is longer than {policy.max_id_chars} characters", None)
    used = key_conflict(state, command.idempotency_key, payload_fingerprint(command.text),
                        command.now_ms, policy)
    if used is not None:
        return reject(*used)
    existing_run_id = known.message_run_id
    if existing_run_id is None and command.message_id in state.rolled_back:
        existing_run_id = run_id_for(state.thread_id, command.message_id)
    if existing_run_id is not None:
        return reject(RejectReason.DUPLICATE, "message id already has a run", existing_run_id)
    accepted = MessageAccepted(
        thread_id=state.thread_id,
        message_id=command.message_id,
        text=command.text,
        idempotency_key=command.idempotency_key,
        at_ms=command.now_ms,
    )
    active = state.active_run
    first: list[Event] = [accepted]
    cancelled: list[Event] = []
    seq, parent = state.message_count, head_of(state)  # it continues the current branch
    if active is not None:
        match command.multitask_strategy:
            case MultitaskStrategy.REJECT:
                return reject(RejectReason.CONFLICT, "another run is active on the thread",
                              active.run_id)
            case MultitaskStrategy.ENQUEUE:
                if len(state.queued) >= policy.max_queued_messages:
                    return reject(RejectReason.CONFLICT, f"the thread already has "
                                  f"{len(state.queued)} messages queued, the limit", active.run_id)
                if any(q.branch for q in state.queued):
                    # It would wait on the branch the queued regenerate or edit leaves.
                    return reject(RejectReason.CONFLICT, "a regenerate or edit is queued on "
                                  "the thread: post once its run has started", active.run_id)
                return [accepted, MessageQueued(thread_id=state.thread_id,
                                                message_id=command.message_id,
                                                ahead=len(state.queued), at_ms=command.now_ms,
                                                parent_seq=stored_parent(seq, parent))]
            case MultitaskStrategy.INTERRUPT | MultitaskStrategy.ROLLBACK:
                reason = CancelReason.INTERRUPTED \
                    if command.multitask_strategy is MultitaskStrategy.INTERRUPT else CancelReason.ROLLED_BACK
                cancelled = [RunCancelled(thread_id=state.thread_id, run_id=active.run_id,
                                          reason=reason, at_ms=command.now_ms)]
                if reason == CancelReason.ROLLED_BACK and active.parent_seq is not None and \
                        head_of(with_rollback(state, active)) != parent:
                    # The head was the rolled-back message, on a branch of its own: the
                    # new one takes its place there, so the cancel comes first.
                    parent = head_of(with_rollback(state, active))
                    first, cancelled = cancelled, first
            case _:
                assert_never(command.multitask_strategy)

    run_id = run_id_for(state.thread_id, command.message_id)
    return [
        *first,
        *cancelled,
        RunAccepted(
            thread_id=state.thread_id,
            run_id=run_id,
            workflow_id=workflow_id_for(state.thread_id),
            message_id=command.message_id,
            at_ms=command.now_ms,
            parent_seq=stored_parent(seq, parent),
        ),
        AttemptDispatched(
            thread_id=state.thread_id,
            run_id=run_id,
            message_id=command.message_id,
            attempt=1,
            at_ms=command.now_ms,
        ),
    ]


def _start_queued(state: ThreadState | None, events: list[Event], policy: Policy) -> list[Event]:
    """`events`, then the oldest queued message's run if they leave no run active."""
    after = apply(state, events, policy)
    if after is None or after.active_run is not None or not after.queued:
        return events
    head, at_ms = after.queued[0], events[-1].at_ms
    run_id = head.run_id or run_id_for(after.thread_id, head.message_id)
    switched: list[Event] = []
    if head.branch and head.seq != head_of(after):  # a regenerate's or edit's branch
        switched = [BranchSwitched(thread_id=after.thread_id, seq=head.seq, at_ms=at_ms)]
    return [
        *events,
        *switched,
        RunAccepted(thread_id=after.thread_id, run_id=run_id,
                    workflow_id=workflow_id_for(after.thread_id), message_id=head.message_id,
                    at_ms=at_ms, parent_seq=head.parent_seq),
        AttemptDispatched(thread_id=after.thread_id, run_id=run_id, message_id=head.message_id,
                          attempt=1, at_ms=at_ms),
    ]


def _cancel_run(state: ThreadState | None, command: CancelRun) -> list[Event]:
    if state is None or state.tenant != command.tenant:
        return []
    run = state.active_run
    if run is None or run.run_id != command.run_id:
        return []
    return [
        RunCancelled(
            thread_id=state.thread_id,
            run_id=run.run_id,
            # A client's own reason never means what a double text's does (a rollback
            # tombstones the run's message), but both travel in the one string
            # RunCancelled.reason: a client's text equal to a double text's reason is
            # carried as "cancel: <text>". Only a second field (a schema change) can
            # carry it unchanged.
            reason=command.reason if command.reason not in _DOUBLE_TEXT
            else f"cancel: {command.reason}",
            at_ms=command.now_ms,
        )
    ]


def _check_deadlines(
    state: ThreadState | None, command: CheckDeadlines, policy: Policy
) -> list[Event]:
    if state is None or state.active_run is None:
        return []
    run = state.active_run
    now = command.now_ms
    if run.status in _LIVE:
        # Must agree with next_deadline_ms: strictly later than the timeout.
        if now > run.last_heartbeat_ms + policy.heartbeat_timeout_ms:
            return _attempt_failed(state, run, FailureCode.HEARTBEAT_TIMEOUT,
                                   FailureCode.HEARTBEAT_TIMEOUT, True, now, policy)
        if now > run.attempt_started_ms + policy.attempt_timeout_ms:
            return _attempt_failed(state, run, FailureCode.ATTEMPT_TIMEOUT,
                                   FailureCode.ATTEMPT_TIMEOUT, True, now, policy)
        return []
    if interrupted(run):
        return timed_out(state, run, now, policy)
    if run.status is RunStatus.RETRY_WAIT and run.retry_due_ms is not None:
        if now < run.retry_due_ms:
            return []
        next_attempt = run.attempt + 1
        if next_attempt > policy.max_attempts:
            # Only if max_attempts was lowered while the run waited.
            return [
                RunFailed(
                    thread_id=state.thread_id,
                    run_id=run.run_id,
                    attempt=run.attempt,
                    error="attempts exhausted",
                    at_ms=now,
                )
            ]
        return [
            AttemptDispatched(
                thread_id=state.thread_id,
                run_id=run.run_id,
                message_id=run.message_id,
                attempt=next_attempt,
                at_ms=now,
            )
        ]
    return []


def _worker_report(state: ThreadState | None, report: WorkerReport, policy: Policy) -> list[Event]:
    if state is None:
        return []
    if isinstance(report, ReportAttemptCompleted) and _is_partial_answer(state, report, policy):
        return [PartialAnswerStored(thread_id=state.thread_id, run_id=report.run_id,
                                    attempt=report.attempt, message=AssistantMessage(
                                        message_id=answer_message_id_for(report.run_id),
                                        text=report.final_text, steps=report.steps,
                                        citations=report.citations),
                                    at_ms=report.now_ms)]
    run = state.active_run
    # The fence: the active run, its current attempt, and that attempt still live.
    if (
        run is None
        or run.run_id != report.run_id
        or run.attempt != report.attempt
        or report.attempt < 1
        or run.status not in _LIVE
    ):
        return []
    match report:
        case ReportAttemptStarted():
            if run.status is RunStatus.RUNNING:
                return []
            return [
                AttemptStarted(
                    thread_id=state.thread_id,
                    run_id=run.run_id,
                    attempt=run.attempt,
                    worker_id=report.worker_id,
                    at_ms=report.now_ms,
                )
            ]
        case ReportHeartbeat():
            # No newer than the last sign of life: a redelivery, nothing to record.
            if report.now_ms <= run.last_heartbeat_ms:
                return []
            return [
                HeartbeatRecorded(
                    thread_id=state.thread_id,
                    run_id=run.run_id,
                    attempt=run.attempt,
                    at_ms=report.now_ms,
                )
            ]
        case ReportAttemptCompleted():
            if output_bytes(report) > policy.max_output_bytes:
                return [RunFailed(thread_id=state.thread_id, run_id=run.run_id, attempt=run.attempt,
                                  error=FailureCode.OUTPUT_TOO_LARGE, at_ms=report.now_ms)]
            answer = AssistantMessage(
                message_id=answer_message_id_for(run.run_id),
                text=report.final_text,
                steps=report.steps,
                citations=report.citations,
            )
            return [
                RunCompleted(
                    thread_id=state.thread_id,
                    run_id=run.run_id,
                    attempt=run.attempt,
                    message=answer,
                    at_ms=report.now_ms,
                )
            ]
        case ReportStepCompleted():
            return _step_completed(state, run, report, policy)
        case ReportExecutionStarted():
            return [ExecutionStarted(thread_id=state.thread_id, run_id=run.run_id,
                                     attempt=run.attempt, execution_id=report.execution_id,
                                     at_ms=report.now_ms)]
        case ReportAttemptFailed():
            return _attempt_failed(
                state,
                run,
                f"failed: {report.error}",
                report.error,
                report.retryable,
                report.now_ms,
                policy,
            )
        case _:
            assert_never(report)


def _step_completed(state: ThreadState, run: ActiveRun, report: ReportStepCompleted,
                    policy: Policy) -> list[Event]:
    """The run's next step joins its journal; a repeat (an older step number, e.g. a
    redelivery or another execution of the attempt that was first) or a gap decides
    nothing; a step past the caps ends the run, not retryably."""
    entry = report.entry
    if entry.step != len(run.journal):
        return []
    if entry.kind == INTERRUPT:
        return reported_interrupt(state, run, report, policy)
    reason = admit(run.journal, entry, policy.journal)
    if reason is not None:
        return [RunFailed(thread_id=state.thread_id, run_id=run.run_id, attempt=run.attempt,
                          error=reason, at_ms=report.now_ms)]
    return [StepRecorded(thread_id=state.thread_id, run_id=run.run_id, attempt=run.attempt,
                         entry=entry, at_ms=report.now_ms)]


def _is_partial_answer(state: ThreadState, report: ReportAttemptCompleted,
                       policy: Policy) -> bool:
    """Whether `report` is the interrupted run's partial answer, still to be stored:
    the run and attempt the interrupt stopped, with something in it, and not too big."""
    run = state.interrupted
    return (run is not None and run.run_id == report.run_id and run.attempts == report.attempt
            and (state.active_run is None or state.active_run.run_id != report.run_id)
            and bool(report.final_text or report.steps or report.citations)
            and output_bytes(report) <= policy.max_output_bytes)


def _attempt_failed(
    state: ThreadState,
    run: ActiveRun,
    retry_reason: str,
    error: str,
    retryable: bool,
    now: int,
    policy: Policy,
) -> list[Event]:
    if retryable and run.attempt < policy.max_attempts:
        return [
            RetryScheduled(
                thread_id=state.thread_id,
                run_id=run.run_id,
                failed_attempt=run.attempt,
                next_attempt=run.attempt + 1,
                due_ms=now + _backoff_ms(policy, run.attempt),
                reason=retry_reason,
                at_ms=now,
            )
        ]
    return [
        RunFailed(
            thread_id=state.thread_id,
            run_id=run.run_id,
            attempt=run.attempt,
            error=error,
            at_ms=now,
        )
    ]


def _backoff_ms(policy: Policy, failed_attempt: int) -> int:
    try:
        return policy.backoff_ms(failed_attempt)
    except OverflowError:  # multiplier ** attempt past float range: long since capped
        return policy.backoff_max_ms


# --- evolve, per event ---------------------------------------------------------


def output_bytes(report: ReportAttemptCompleted) -> int:
    """The UTF-8 size of what a completed attempt stores: text, steps and citations."""
    size = len(report.final_text.encode("utf-8", "surrogatepass"))
    for step in report.steps:
        size += sum(len(x.encode("utf-8", "surrogatepass"))
                    for x in (step.kind, step.name, step.payload_json))
    for citation in report.citations:
        size += sum(len(x.encode("utf-8", "surrogatepass")) for x in (citation.url, citation.title))
    return size


def _message_accepted(state: ThreadState, event: MessageAccepted, policy: Policy) -> ThreadState:
    idempotency = state.idempotency
    if event.idempotency_key is not None:
        record = IdempotencyRecord(
            message_id=event.message_id,
            run_id=run_id_for(state.thread_id, event.message_id),
            payload_fingerprint=payload_fingerprint(event.text),
            at_ms=event.at_ms,
        )
        idempotency = bounded_keys(idempotency, event.idempotency_key, record, policy)
    if event.parent_seq is None:  # it continues the current branch
        stored = with_message_stored(state, head_of(state), on_branch=True)
    else:  # an edit: a branch of its own, made current by a BranchSwitched
        stored = with_message_stored(state, event.parent_seq, on_branch=False)
    return replace(stored, idempotency=idempotency, updated_at_ms=event.at_ms)


def _message_queued(state: ThreadState, event: MessageQueued) -> ThreadState:
    # By default decide emits MessageAccepted right before: the message is the newest.
    seq = state.message_count - 1 if event.seq is None else event.seq
    queued = QueuedMessage(message_id=event.message_id, seq=seq, at_ms=event.at_ms,
                           run_id=event.run_id, branch=event.branch, parent_seq=event.parent_seq)
    return replace(state, queued=(*state.queued, queued), updated_at_ms=event.at_ms)


def _run_accepted(state: ThreadState, event: RunAccepted) -> ThreadState:
    if state.active_run is not None:
        return state
    # A queued message's run: its seq is where it was stored, and it leaves the queue.
    # Otherwise it is the current branch's head: the message decide accepted right
    # before, or the one a regenerate switched to.
    seq, queued = head_of(state), state.queued
    for index, waiting in enumerate(queued):
        if (waiting.run_id or run_id_for(state.thread_id, waiting.message_id)) == event.run_id:
            seq, queued = waiting.seq, (*queued[:index], *queued[index + 1:])
            break
    run = ActiveRun(
        run_id=event.run_id,
        message_id=event.message_id,
        attempt=0,
        status=RunStatus.DISPATCHED,
        attempt_started_ms=event.at_ms,
        last_heartbeat_ms=event.at_ms,
        retry_due_ms=None,
        message_seq=seq,
        accepted_at_ms=event.at_ms,
        parent_seq=event.parent_seq,
    )
    return replace(state, active_run=run, run_count=state.run_count + 1, queued=queued,
                   updated_at_ms=event.at_ms)


def _run_event(state: ThreadState, event: _RunEvent, policy: Policy) -> ThreadState:
    run = state.active_run
    if run is None or run.run_id != event.run_id:
        return state
    match event:
        case AttemptDispatched():
            return _update_run(
                state,
                replace(
                    run,
                    attempt=event.attempt,
                    status=RunStatus.DISPATCHED,
                    attempt_started_ms=event.at_ms,
                    last_heartbeat_ms=event.at_ms,
                    retry_due_ms=None,
                    interrupt_json=None,
                ),
                event.at_ms,
            )
        case AttemptStarted():
            if event.attempt != run.attempt:
                return state
            return _update_run(
                state,
                replace(
                    run,
                    status=RunStatus.RUNNING,
                    last_heartbeat_ms=max(run.last_heartbeat_ms, event.at_ms),
                ),
                event.at_ms,
            )
        case HeartbeatRecorded():
            if event.attempt != run.attempt:
                return state
            updated = replace(run, last_heartbeat_ms=max(run.last_heartbeat_ms, event.at_ms))
            return replace(state, active_run=updated)
        case RetryScheduled():
            return _update_run(
                state, replace(run, status=RunStatus.RETRY_WAIT, retry_due_ms=event.due_ms),
                event.at_ms,
            )
        case RunInterrupted():
            return _update_run(state, on_interrupted(run, event), event.at_ms)
        case ExecutionStarted():
            if event.attempt != run.attempt:
                return state
            return replace(state, active_run=replace(
                run, last_heartbeat_ms=max(run.last_heartbeat_ms, event.at_ms)))
        case StepRecorded():
            if event.attempt != run.attempt or event.entry.step != len(run.journal):
                return state
            return _update_run(state, replace(
                run, journal=(*run.journal, event.entry),
                last_heartbeat_ms=max(run.last_heartbeat_ms, event.at_ms)), event.at_ms)
        case RunCompleted():
            ended = _end_run(state, run, RunStatus.COMPLETED, event.at_ms)
            # The answer is stored on the current branch (the run's: a branch changes
            # only while no run is active, or by cancelling it).
            return with_message_stored(ended, head_of(ended), on_branch=True)
        case RunFailed():
            return _end_run(state, run, RunStatus.FAILED, event.at_ms)
        case RunCancelled():
            ended = _end_run(state, run, RunStatus.CANCELLED, event.at_ms)
            if event.reason == CancelReason.INTERRUPTED:  # its worker reports what it had streamed
                return replace(ended, interrupted=ended.last_run, interrupted_tip_seq=-1)
            if event.reason != CancelReason.ROLLED_BACK:
                return ended
            keep = max(policy.max_idempotency_keys, 1)
            return replace(with_rollback(ended, run),
                           rolled_back=(*state.rolled_back, run.message_id)[-keep:])
        case _:
            assert_never(event)


def _update_run(state: ThreadState, run: ActiveRun, at_ms: int) -> ThreadState:
    return replace(state, active_run=run, updated_at_ms=at_ms)


def _end_run(state: ThreadState, run: ActiveRun, status: RunStatus, at_ms: int) -> ThreadState:
    record = RunRecord(
        run_id=run.run_id, message_id=run.message_id, status=status, attempts=run.attempt
    )
    return replace(state, active_run=None, last_run=record, updated_at_ms=at_ms)
