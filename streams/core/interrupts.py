"""Human in the loop, the pure rules: a run that waits for a person.

An agent (or a tool) calls `await interrupt(payload)`; the worker reports the
interrupt as the run's next step with no output yet (`ReportStepCompleted`, kind
`interrupt`). Decided on the live attempt, it is `RunInterrupted`: the run is
`interrupted` (on the wire: `retry_wait` with no retry due and the payload in
`ActiveRun.interrupt_json`), needs no heartbeats, still counts as the thread's
active run (a post is a conflict, or follows the multitask strategy), and can be
cancelled. `ResumeRun` with a value records the interrupt as a completed step whose
output is the value (`StepRecorded`) and dispatches the same attempt again
(`AttemptDispatched`): the new execution replays the journal, and `interrupt()`
returns the value. `Policy.interrupt_timeout_ms` (0: none) ends a run that waits
longer `run_failed` `interrupt_timeout`.

Pure: `streams.core.thread` calls these from `decide`, `evolve` and the deadlines.
"""

from __future__ import annotations

from dataclasses import replace

from streams.core.domain import (
    ActiveRun,
    AttemptDispatched,
    Event,
    Policy,
    ReportStepCompleted,
    ResumeRun,
    RunFailed,
    RunInterrupted,
    RunStatus,
    StepRecorded,
    ThreadState,
)
from streams.core.journal import INTERRUPT, JournalEntry, admit
from streams.core.reasons import FailureCode

__all__ = ["RESUMED_BY", "interrupt_deadline_ms", "interrupted",
           "on_interrupted", "reported_interrupt", "resume_run", "timed_out"]

RESUMED_BY = "resume"  # JournalEntry.execution_id of an interrupt completed by ResumeRun


def reported_interrupt(state: ThreadState, run: ActiveRun, report: ReportStepCompleted,
                       policy: Policy) -> list[Event]:
    """A live attempt's interrupt (already fenced, at the next step number)."""
    entry = report.entry
    reason = admit(run.journal, entry, policy.journal)
    if reason is not None:
        return [RunFailed(thread_id=state.thread_id, run_id=run.run_id, attempt=run.attempt,
                          error=reason, at_ms=report.now_ms)]
    return [RunInterrupted(thread_id=state.thread_id, run_id=run.run_id, attempt=run.attempt,
                           step=entry.step, payload_json=entry.input_json, at_ms=report.now_ms)]


def resume_run(state: ThreadState | None, command: ResumeRun, policy: Policy) -> list[Event]:
    """The interrupted run's interrupt recorded with the value, and the attempt dispatched
    again; anything else (another tenant, run or status, a value past the caps) decides
    nothing."""
    if state is None or state.tenant != command.tenant:
        return []
    run = state.active_run
    if run is None or run.run_id != command.run_id or not run.awaiting_resume:
        return []
    entry = JournalEntry(len(run.journal), INTERRUPT, INTERRUPT, run.interrupt_json or "null",
                         command.value_json, RESUMED_BY)
    if admit(run.journal, entry, policy.journal) is not None:
        return []
    return [StepRecorded(thread_id=state.thread_id, run_id=run.run_id, attempt=run.attempt,
                         entry=entry, at_ms=command.now_ms),
            AttemptDispatched(thread_id=state.thread_id, run_id=run.run_id,
                              message_id=run.message_id, attempt=run.attempt,
                              at_ms=command.now_ms)]


def on_interrupted(run: ActiveRun, event: RunInterrupted) -> ActiveRun:
    """The run once interrupted: waiting, with the payload, since `event.at_ms`."""
    if event.attempt != run.attempt or event.step != len(run.journal):
        return run
    return replace(run, status=RunStatus.RETRY_WAIT, retry_due_ms=None,
                   interrupt_json=event.payload_json, last_heartbeat_ms=event.at_ms)


def interrupted(run: ActiveRun) -> bool:
    """Whether the run waits for a resume."""
    return run.awaiting_resume


def interrupt_deadline_ms(run: ActiveRun, policy: Policy) -> int | None:
    """When an interrupted run gives up waiting, or None (no timeout)."""
    if policy.interrupt_timeout_ms <= 0:
        return None
    return run.last_heartbeat_ms + policy.interrupt_timeout_ms + 1


def timed_out(state: ThreadState, run: ActiveRun, now: int, policy: Policy) -> list[Event]:
    """RunFailed once the interrupted run has waited past the timeout."""
    due = interrupt_deadline_ms(run, policy)
    if due is None or now < due:
        return []
    return [RunFailed(thread_id=state.thread_id, run_id=run.run_id, attempt=run.attempt,
                      error=FailureCode.INTERRUPT_TIMEOUT, at_ms=now)]
