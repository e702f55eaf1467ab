"""A run's lifecycle: the names on the wire, the records the processor mirrors, and
the one fold of "what happened to this run" that the worker, the gateway and the
chaos audit all read.

Pure: no I/O, no clock. The processor writes a `RunLifecycle` record to the stream
topic for each of the decisions in `Lifecycle` (`lifecycle_record`); a reader folds
them per run into a `RunFate`: whether the run ended, and from which attempt on
output may still count.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from streams.core.domain import (
    AttemptDispatched,
    Event,
    ExecutionStarted,
    RetryScheduled,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunInterrupted,
    StepRecorded,
    ThreadState,
)
from streams.core.ids import answer_message_id_for, workflow_id_for
from streams.core.journal import JournalEntry, entry_to_json
from streams.core.reasons import CancelReason
from streams.core.records import Dispatch, HistoryMessage, RunLifecycle, StreamOutput

__all__ = [
    "TERMINAL",
    "Lifecycle",
    "RunFate",
    "StreamEnd",
    "dispatch_record",
    "lifecycle_record",
]


class Lifecycle(StrEnum):
    """The `RunLifecycle.event` names; the values are on the wire and are SSE event names."""

    RUN_ACCEPTED = "run_accepted"
    ATTEMPT_DISPATCHED = "attempt_dispatched"
    RETRY_SCHEDULED = "retry_scheduled"
    RUN_COMPLETED = "run_completed"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"
    # A step joined the run's journal (detail: the entry as JSON). For workers: the
    # gateway does not pass it on to clients, which see the step's `step` events.
    STEP_RECORDED = "step_recorded"
    # The run waits for a human (detail: the agent's payload, JSON); resumed, the same
    # attempt is dispatched again (`attempt_dispatched`).
    INTERRUPT = "interrupt"
    # An execution of the attempt began (detail: its id). For workers: once an
    # execution reads its own, the journal it reads is complete. Not passed to clients.
    EXECUTION_STARTED = "execution_started"


class StreamEnd(StrEnum):
    """The SSE events that end a client's stream and are not lifecycle records."""

    DONE = "done"  # after a terminal lifecycle event
    MESSAGE_NOT_STREAMING = "message_not_streaming"  # the replay position is gone


# The lifecycle events after which a run has no more output.
TERMINAL = frozenset({Lifecycle.RUN_COMPLETED, Lifecycle.RUN_FAILED, Lifecycle.RUN_CANCELLED})

_NAMES: dict[type, Lifecycle] = {
    RunAccepted: Lifecycle.RUN_ACCEPTED, AttemptDispatched: Lifecycle.ATTEMPT_DISPATCHED,
    RetryScheduled: Lifecycle.RETRY_SCHEDULED, RunCompleted: Lifecycle.RUN_COMPLETED,
    RunFailed: Lifecycle.RUN_FAILED, RunCancelled: Lifecycle.RUN_CANCELLED,
    StepRecorded: Lifecycle.STEP_RECORDED, RunInterrupted: Lifecycle.INTERRUPT,
    ExecutionStarted: Lifecycle.EXECUTION_STARTED,
}


@dataclass(slots=True)
class RunFate:
    """What a run's lifecycle records say so far: whether it ended, and the first
    attempt whose output may still count (attempts number from 1)."""

    ended: bool = False  # completed, failed or cancelled: every attempt is over
    min_attempt: int = 0  # attempts below this one are over
    # The attempt a double text interrupted (run_cancelled, detail "interrupted"): its
    # worker reports the answer so far, which the processor stores marked. 0: none.
    interrupted_attempt: int = 0

    def learn(self, event: str, attempt: int, detail: str = "") -> bool:
        """Fold one lifecycle record in; False if `event` says nothing of the run's fate."""
        if event == Lifecycle.ATTEMPT_DISPATCHED:
            self.min_attempt = max(self.min_attempt, attempt)
        elif event == Lifecycle.RETRY_SCHEDULED:  # `attempt` is the failed one
            self.min_attempt = max(self.min_attempt, attempt + 1)
        elif event in TERMINAL:
            if event == Lifecycle.RUN_CANCELLED and detail == CancelReason.INTERRUPTED and not self.ended:
                self.interrupted_attempt = attempt
            self.ended = True
        else:
            return False
        return True

    def kills(self, attempt: int) -> bool:
        """Whether `attempt` of this run is over (its output no longer counts)."""
        return self.ended or attempt < self.min_attempt


def lifecycle_record(event: Event, before: ThreadState | None) -> StreamOutput | None:
    """The SSE-visible decisions, for the stream topic (see `RunLifecycle`); `before`
    is the state the event was decided on."""
    name = _NAMES.get(type(event))
    # Every event named there has a run id (a MessageQueued's optional one is not).
    run_id = getattr(event, "run_id", None)
    if name is None or before is None or not isinstance(run_id, str):
        return None
    run = before.active_run if before.active_run and before.active_run.run_id == run_id else None
    user_message_id = event.message_id if isinstance(event, RunAccepted) else \
        (run.message_id if run else "")
    attempt, detail, message, branch = 0, "", None, None
    if isinstance(event, AttemptDispatched):
        attempt = event.attempt
    elif isinstance(event, RetryScheduled):
        attempt, detail = event.failed_attempt, event.reason
    elif isinstance(event, RunCompleted):
        attempt, message = event.attempt, event.message
        # Stored at the next seq (`history.history_writes`), on the current branch.
        branch = before.message_count if run is not None else None
    elif isinstance(event, RunFailed):
        attempt, detail = event.attempt, event.error
    elif isinstance(event, RunCancelled):
        attempt = run.attempt if run else 0  # the attempt that was running
        detail = event.reason
    elif isinstance(event, ExecutionStarted):
        attempt, detail = event.attempt, event.execution_id
    elif isinstance(event, RunInterrupted):
        attempt, detail = event.attempt, event.payload_json
    elif isinstance(event, StepRecorded):
        attempt, detail = event.attempt, entry_to_json(event.entry)
    return StreamOutput(run_id=run_id, attempt=attempt, message_id=answer_message_id_for(run_id),
                        part_id="lifecycle", seq=0,
                        payload=RunLifecycle(name.value, user_message_id, detail, message, branch))


def dispatch_record(event: AttemptDispatched, thread_id: str, input_text: str,
                    context: tuple[HistoryMessage, ...],
                    journal: tuple[JournalEntry, ...] = ()) -> Dispatch:
    """The dispatch record handing attempt `event` to the workers, with `context` and
    the steps earlier attempts completed (`journal`)."""
    return Dispatch(run_id=event.run_id, message_id=event.message_id, attempt=event.attempt,
                    workflow_id=workflow_id_for(thread_id), input_text=input_text,
                    history=context, dispatched_at_ms=event.at_ms, journal=journal)
