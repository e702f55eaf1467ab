"""The per-thread decider: pure `decide` and `evolve` over `streams.domain`.

`decide(state, command, policy)` turns a command into events; `evolve(state, event)`
folds one event into the state. Neither does I/O, reads the clock or draws random
numbers: time arrives as `now_ms` in the command and ids are derived with uuid5, so
a recorded command log always replays to the same events.

A business rejection is a `RunRejected` event; a command that changes nothing (an
idempotent repeat, a stale or redelivered worker report) decides no events.
Worker reports are fenced by the attempt number: only reports naming the active run
and its current, still live attempt are acted on.

`evolve` is total: an event that does not apply to the state (which `decide` never
produces) leaves the state unchanged. States are never mutated in place; mappings
are rebuilt and wrapped read-only.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import lru_cache
from types import MappingProxyType
from typing import TypeVar, assert_never

from streams.domain import (
    ActiveRun,
    AssistantMessage,
    AttemptDispatched,
    AttemptStarted,
    CancelRun,
    CheckDeadlines,
    Command,
    CreateThread,
    Event,
    HeartbeatRecorded,
    IdempotencyRecord,
    MessageAccepted,
    Policy,
    PostUserMessage,
    RejectReason,
    ReportAttemptCompleted,
    ReportAttemptFailed,
    ReportAttemptStarted,
    ReportHeartbeat,
    RetryScheduled,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunRecord,
    RunRejected,
    RunStatus,
    StoredMessage,
    ThreadCreated,
    ThreadState,
    workflow_id_for,
)

__all__ = [
    "ATTEMPT_TIMEOUT",
    "HEARTBEAT_TIMEOUT",
    "answer_message_id_for",
    "apply",
    "decide",
    "evolve",
    "initial_state",
    "next_deadline_ms",
    "payload_fingerprint",
    "run_id_for",
    "uuid5_text",
]

# Fixed forever: changing it changes every derived run and message id.
_ID_NAMESPACE = uuid.UUID("d54544ca-b4dd-48dd-a9c2-e9e2b46811a5")
_ID_NAMESPACE_BYTES = _ID_NAMESPACE.bytes

_V = TypeVar("_V")

_LIVE = frozenset({RunStatus.DISPATCHED, RunStatus.RUNNING})

_WorkerReport = (
    ReportAttemptStarted | ReportHeartbeat | ReportAttemptCompleted | ReportAttemptFailed
)
_RunEvent = (
    AttemptDispatched
    | AttemptStarted
    | HeartbeatRecorded
    | RetryScheduled
    | RunCompleted
    | RunFailed
    | RunCancelled
)

# RetryScheduled.reason and RunFailed.error when a deadline ends an attempt.
HEARTBEAT_TIMEOUT = "heartbeat_timeout"
ATTEMPT_TIMEOUT = "attempt_timeout"


# --- ids ---------------------------------------------------------------------


def _uuid5(name: str) -> str:
    # uuid.uuid5 itself, but "surrogatepass" so that no string can make it raise.
    data = _ID_NAMESPACE_BYTES + name.encode("utf-8", "surrogatepass")
    return uuid5_text(hashlib.sha1(data, usedforsecurity=False).digest())


def uuid5_text(sha1_digest: bytes) -> str:
    """`str(uuid.UUID(bytes=sha1_digest[:16], version=5))`, without building a UUID
    (a third of the cost of an id, which the processor makes several of per command)."""
    b = bytearray(sha1_digest[:16])
    b[6] = (b[6] & 0x0F) | 0x50  # version 5
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@lru_cache(maxsize=16_384)
def run_id_for(thread_id: str, message_id: str) -> str:
    """The run id a user message starts: the same message always maps to the same run."""
    # Length-prefixed so that ("a:b", "c") and ("a", "b:c") cannot collide.
    return _uuid5(f"run:{len(thread_id)}:{thread_id}:{message_id}")


@lru_cache(maxsize=16_384)  # pure; decide, evolve and the lifecycle mirror ask in turn
def answer_message_id_for(run_id: str) -> str:
    """The message id of the assistant answer that completes `run_id`."""
    return _uuid5(f"answer:{run_id}")


def payload_fingerprint(text: str) -> str:
    """SHA-256 hex digest of a message text, stored with its idempotency key."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# --- the decider ---------------------------------------------------------------


def initial_state() -> ThreadState | None:
    """The state before any event: the thread does not exist."""
    return None


def decide(state: ThreadState | None, command: Command, policy: Policy) -> list[Event]:
    """The events `command` causes on `state`; never raises, never mutates."""
    match command:
        case CreateThread():
            return _create_thread(state, command)
        case PostUserMessage():
            return _post_user_message(state, command, policy)
        case CancelRun():
            return _cancel_run(state, command)
        case CheckDeadlines():
            return _check_deadlines(state, command, policy)
        case _:
            # mypy narrows what is left to the four worker reports.
            return _worker_report(state, command, policy)


def evolve(state: ThreadState | None, event: Event) -> ThreadState | None:
    """The state after `event`; returns a new state and leaves `state` untouched."""
    if isinstance(event, ThreadCreated):
        if state is not None:
            return state
        return ThreadState(
            thread_id=event.thread_id,
            tenant=event.tenant,
            title=event.title,
            created_at_ms=event.at_ms,
        )
    if state is None or isinstance(event, RunRejected):
        return state
    if isinstance(event, MessageAccepted):
        return _message_accepted(state, event)
    if isinstance(event, RunAccepted):
        return _run_accepted(state, event)
    return _run_event(state, event)


def apply(state: ThreadState | None, events: Iterable[Event]) -> ThreadState | None:
    """Fold `evolve` over `events`."""
    for event in events:
        state = evolve(state, event)
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
    if run.status is RunStatus.RETRY_WAIT:
        return run.retry_due_ms
    return None


# --- decide, per command -------------------------------------------------------


def _create_thread(state: ThreadState | None, command: CreateThread) -> list[Event]:
    if state is not None:
        return []
    return [
        ThreadCreated(
            thread_id=command.thread_id,
            tenant=command.tenant,
            title=command.title,
            at_ms=command.now_ms,
        )
    ]


def _post_user_message(
    state: ThreadState | None, command: PostUserMessage, policy: Policy
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
    if command.idempotency_key is not None:
        record = state.idempotency.get(command.idempotency_key)
        if record is not None:
            if record.payload_fingerprint == payload_fingerprint(command.text):
                return reject(RejectReason.DUPLICATE, "idempotency key already used", record.run_id)
            return reject(
                RejectReason.PAYLOAD_MISMATCH,
                "idempotency key already used with another payload",
                record.run_id,
            )
    existing_run_id = state.run_by_message.get(command.message_id)
    if existing_run_id is not None:
        return reject(RejectReason.DUPLICATE, "message id already has a run", existing_run_id)
    if state.active_run is not None:
        return reject(
            RejectReason.CONFLICT, "another run is active on the thread", state.active_run.run_id
        )

    run_id = run_id_for(state.thread_id, command.message_id)
    return [
        MessageAccepted(
            thread_id=state.thread_id,
            message_id=command.message_id,
            text=command.text,
            idempotency_key=command.idempotency_key,
            at_ms=command.now_ms,
        ),
        RunAccepted(
            thread_id=state.thread_id,
            run_id=run_id,
            workflow_id=workflow_id_for(state.thread_id),
            message_id=command.message_id,
            at_ms=command.now_ms,
        ),
        AttemptDispatched(
            thread_id=state.thread_id,
            run_id=run_id,
            message_id=command.message_id,
            attempt=1,
            at_ms=command.now_ms,
        ),
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
            reason=command.reason,
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
            return _attempt_failed(
                state, run, HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT, True, now, policy
            )
        if now > run.attempt_started_ms + policy.attempt_timeout_ms:
            return _attempt_failed(state, run, ATTEMPT_TIMEOUT, ATTEMPT_TIMEOUT, True, now, policy)
        return []
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


def _worker_report(state: ThreadState | None, report: _WorkerReport, policy: Policy) -> list[Event]:
    if state is None:
        return []
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


def _with(mapping: Mapping[str, _V], key: str, value: _V) -> Mapping[str, _V]:
    return MappingProxyType({**mapping, key: value})


def _message_accepted(state: ThreadState, event: MessageAccepted) -> ThreadState:
    run_id = run_id_for(state.thread_id, event.message_id)
    message = StoredMessage(
        message_id=event.message_id,
        role="user",
        text=event.text,
        run_id=run_id,
        created_at_ms=event.at_ms,
    )
    idempotency = state.idempotency
    if event.idempotency_key is not None:
        record = IdempotencyRecord(
            message_id=event.message_id,
            run_id=run_id,
            payload_fingerprint=payload_fingerprint(event.text),
        )
        idempotency = _with(idempotency, event.idempotency_key, record)
    return replace(state, messages=(*state.messages, message), idempotency=idempotency)


def _run_accepted(state: ThreadState, event: RunAccepted) -> ThreadState:
    if state.active_run is not None:
        return state
    run = ActiveRun(
        run_id=event.run_id,
        message_id=event.message_id,
        attempt=0,
        status=RunStatus.DISPATCHED,
        attempt_started_ms=event.at_ms,
        last_heartbeat_ms=event.at_ms,
        retry_due_ms=None,
    )
    record = RunRecord(
        run_id=event.run_id, message_id=event.message_id, status=RunStatus.DISPATCHED, attempts=0
    )
    return replace(
        state,
        active_run=run,
        runs=_with(state.runs, event.run_id, record),
        run_by_message=_with(state.run_by_message, event.message_id, event.run_id),
    )


def _run_event(state: ThreadState, event: _RunEvent) -> ThreadState:
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
                ),
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
            )
        case HeartbeatRecorded():
            if event.attempt != run.attempt:
                return state
            # Status and attempts are unchanged, so the run record is left alone.
            updated = replace(run, last_heartbeat_ms=max(run.last_heartbeat_ms, event.at_ms))
            return replace(state, active_run=updated)
        case RetryScheduled():
            return _update_run(
                state, replace(run, status=RunStatus.RETRY_WAIT, retry_due_ms=event.due_ms)
            )
        case RunCompleted():
            answer = StoredMessage(
                message_id=event.message.message_id,
                role="assistant",
                text=event.message.text,
                run_id=run.run_id,
                created_at_ms=event.at_ms,
                steps=event.message.steps,
                citations=event.message.citations,
            )
            ended = _end_run(state, run, RunStatus.COMPLETED)
            return replace(ended, messages=(*ended.messages, answer))
        case RunFailed():
            return _end_run(state, run, RunStatus.FAILED)
        case RunCancelled():
            return _end_run(state, run, RunStatus.CANCELLED)
        case _:
            assert_never(event)


def _update_run(state: ThreadState, run: ActiveRun) -> ThreadState:
    record = RunRecord(
        run_id=run.run_id, message_id=run.message_id, status=run.status, attempts=run.attempt
    )
    return replace(state, active_run=run, runs=_with(state.runs, run.run_id, record))


def _end_run(state: ThreadState, run: ActiveRun, status: RunStatus) -> ThreadState:
    record = RunRecord(
        run_id=run.run_id, message_id=run.message_id, status=status, attempts=run.attempt
    )
    return replace(state, active_run=None, runs=_with(state.runs, run.run_id, record))
