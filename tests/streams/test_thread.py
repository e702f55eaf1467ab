"""The per-thread decider: given events, when a command, then events."""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from unittest.mock import ANY

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from streams.core.domain import (
    AssistantMessage,
    AttemptDispatched,
    AttemptStarted,
    CancelRun,
    CheckDeadlines,
    Citation,
    Command,
    CreateThread,
    DeleteThread,
    Event,
    HeartbeatRecorded,
    IdempotencyRecord,
    Known,
    MessageAccepted,
    MessageQueued,
    MultitaskStrategy,
    PartialAnswerStored,
    Policy,
    PostUserMessage,
    QueuedMessage,
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
    Step,
    ThreadCreated,
    ThreadDeleted,
    ThreadState,
)
from streams.core.ids import answer_message_id_for, run_id_for
from streams.core.reasons import CancelReason
from streams.core.thread import (
    apply,
    decide,
    evolve,
    initial_state,
    next_deadline_ms,
    payload_fingerprint,
)

T = "t-1"
TENANT = "acme"
POLICY = Policy()  # max_attempts=2, backoff 2s doubling to 30s, heartbeat 60s, attempt 300s
RUN1 = run_id_for(T, "m-1")
RUN2 = run_id_for(T, "m-2")
STEPS = (Step(kind="tool_call", name="search", payload_json='{"q": "x"}'),)
CITATIONS = (Citation(url="https://example.com", title="Example"),)


# --- given / when / then --------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    history: tuple[Event, ...]
    policy: Policy
    command: Command | None = None

    def when(self, command: Command) -> _Spec:
        return replace(self, command=command)

    def then(self, expected: Sequence[Event]) -> ThreadState | None:
        """Assert the decided events; return the state after them."""
        assert self.command is not None, "call .when(command) first"
        state = apply(initial_state(), self.history, self.policy)
        actual = decide(state, self.command, self.policy, known_for(self.history, self.command))
        assert actual == list(expected)
        return apply(state, actual, self.policy)


def known_for(history: Iterable[Event], command: Command) -> Known:
    """What the processor's history lookup answers for `command` after `history`."""
    if not isinstance(command, PostUserMessage):
        return Known()
    stored: set[str] = set()
    message_of_run: dict[str, str] = {}
    for event in history:
        if isinstance(event, MessageAccepted):
            stored.add(event.message_id)
        elif isinstance(event, RunAccepted):
            message_of_run[event.run_id] = event.message_id
        elif isinstance(event, RunCancelled) and event.reason == CancelReason.ROLLED_BACK:
            stored.discard(message_of_run.get(event.run_id, ""))  # tombstoned
        elif isinstance(event, ThreadDeleted):  # a deleted thread's history is gone with it
            stored.clear()
    return Known(run_id_for(command.thread_id, command.message_id)
                 if command.message_id in stored else None)


def given(events: Iterable[Event] = (), policy: Policy = POLICY) -> _Spec:
    """Start a given/when/then spec from these past events."""
    return _Spec(history=tuple(events), policy=policy)


class Contains:
    """Equal to any string containing `part` (for rejection details)."""

    def __init__(self, part: str) -> None:
        self.part = part

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and self.part in other

    def __repr__(self) -> str:
        return f"Contains({self.part!r})"


def containing(part: str) -> Any:
    """A `Contains` typed to stand in for a `str` field."""
    return Contains(part)


# --- builders -------------------------------------------------------------------


def created(at: int = 0, title: str = "Trip") -> ThreadCreated:
    """The event of thread T created by tenant acme."""
    return ThreadCreated(thread_id=T, tenant=TENANT, title=title, at_ms=at)


def accepted(
    message_id: str = "m-1", text: str = "hello", key: str | None = None, at: int = 1_000
) -> list[Event]:
    """The events of a message accepted on thread T: message, run accepted, attempt 1 dispatched."""
    run_id = run_id_for(T, message_id)
    return [
        MessageAccepted(
            thread_id=T, message_id=message_id, text=text, idempotency_key=key, at_ms=at
        ),
        RunAccepted(
            thread_id=T, run_id=run_id, workflow_id=f"agent-{T}", message_id=message_id, at_ms=at
        ),
        AttemptDispatched(thread_id=T, run_id=run_id, message_id=message_id, attempt=1, at_ms=at),
    ]


def dispatched(
    attempt: int, at: int, run_id: str = RUN1, message_id: str = "m-1"
) -> AttemptDispatched:
    """The event of an attempt of the run handed to the workers."""
    return AttemptDispatched(
        thread_id=T, run_id=run_id, message_id=message_id, attempt=attempt, at_ms=at
    )


def retry(
    failed: int, at: int, due: int, reason: str = "failed: boom", run_id: str = RUN1
) -> RetryScheduled:
    """The event of a failed attempt whose next attempt is due at `due`."""
    return RetryScheduled(
        thread_id=T,
        run_id=run_id,
        failed_attempt=failed,
        next_attempt=failed + 1,
        due_ms=due,
        reason=reason,
        at_ms=at,
    )


def rejected(
    reason: RejectReason, existing: str | None, message_id: str = "m-1", at: int = 2_000
) -> RunRejected:
    """The event of a message refused for `reason` (any detail text)."""
    return RunRejected(
        thread_id=T,
        message_id=message_id,
        reason=reason,
        detail=ANY,
        existing_run_id=existing,
        at_ms=at,
    )


def completed_event(attempt: int = 1, at: int = 5_000, run_id: str = RUN1) -> RunCompleted:
    """The event of the run completed with the answer, its steps and citations."""
    message = AssistantMessage(
        message_id=answer_message_id_for(run_id), text="answer", steps=STEPS, citations=CITATIONS
    )
    return RunCompleted(thread_id=T, run_id=run_id, attempt=attempt, message=message, at_ms=at)


def post(
    message_id: str = "m-1",
    text: str = "hello",
    key: str | None = None,
    now: int = 2_000,
    tenant: str = TENANT,
    strategy: MultitaskStrategy = MultitaskStrategy.REJECT,
) -> PostUserMessage:
    """The command that posts a user message to thread T."""
    return PostUserMessage(
        thread_id=T,
        tenant=tenant,
        message_id=message_id,
        text=text,
        idempotency_key=key,
        now_ms=now,
        multitask_strategy=strategy,
    )


def started(attempt: int = 1, now: int = 2_000, run_id: str = RUN1) -> ReportAttemptStarted:
    """The worker report that an attempt started."""
    return ReportAttemptStarted(
        thread_id=T, run_id=run_id, attempt=attempt, worker_id="w-1", now_ms=now
    )


def heartbeat(attempt: int = 1, now: int = 3_000, run_id: str = RUN1) -> ReportHeartbeat:
    """The worker report that an attempt is still alive."""
    return ReportHeartbeat(thread_id=T, run_id=run_id, attempt=attempt, worker_id="w-1", now_ms=now)


def complete(attempt: int = 1, now: int = 5_000, run_id: str = RUN1) -> ReportAttemptCompleted:
    """The worker report that an attempt finished with the answer."""
    return ReportAttemptCompleted(
        thread_id=T,
        run_id=run_id,
        attempt=attempt,
        worker_id="w-1",
        final_text="answer",
        steps=STEPS,
        citations=CITATIONS,
        now_ms=now,
    )


def fail(
    attempt: int = 1, now: int = 5_000, retryable: bool = True, run_id: str = RUN1
) -> ReportAttemptFailed:
    """The worker report that an attempt failed."""
    return ReportAttemptFailed(
        thread_id=T,
        run_id=run_id,
        attempt=attempt,
        worker_id="w-1",
        error="boom",
        retryable=retryable,
        now_ms=now,
    )


def tick(now: int) -> CheckDeadlines:
    """The clock command that checks thread T's deadlines at `now`."""
    return CheckDeadlines(thread_id=T, now_ms=now)


def cancel(run_id: str = RUN1, tenant: str = TENANT, now: int = 4_000) -> CancelRun:
    """The command that cancels a run of thread T."""
    return CancelRun(thread_id=T, tenant=tenant, run_id=run_id, reason="user", now_ms=now)


RUNNING = [created(), *accepted()]  # run 1, attempt 1 dispatched at 1_000
IN_RETRY = [*RUNNING, retry(failed=1, at=5_000, due=7_000)]
ATTEMPT_2 = [*IN_RETRY, dispatched(attempt=2, at=7_000)]


# --- 1. CreateThread ----------------------------------------------------------------


def test_create_thread_on_a_missing_thread() -> None:
    """Creating a thread that does not exist records it with its tenant, title and time."""
    state = given([]).when(CreateThread(T, TENANT, "Trip", now_ms=5)).then([created(at=5)])
    assert state == ThreadState(thread_id=T, tenant=TENANT, title="Trip", created_at_ms=5,
                                updated_at_ms=5)


@pytest.mark.parametrize("tenant", [TENANT, "other"])
def test_create_thread_again_is_idempotent_whatever_the_title(tenant: str) -> None:
    """Creating an existing thread again decides nothing, whatever the tenant or title."""
    given([created()]).when(CreateThread(T, tenant, "Another", now_ms=9)).then([])


# --- 2. PostUserMessage -------------------------------------------------------------


def test_a_message_is_accepted_and_its_first_attempt_dispatched() -> None:
    """A posted message is stored as seq 0 and its run starts with attempt 1 dispatched."""
    state = given([created()]).when(post(now=1_000)).then(accepted(at=1_000))
    assert state is not None
    assert (state.message_count, state.run_count) == (1, 1)
    assert state.active_run is not None
    assert (state.active_run.message_seq, state.active_run.accepted_at_ms) == (0, 1_000)
    assert (state.active_run.run_id, state.active_run.attempt) == (RUN1, 1)
    assert state.active_run.status is RunStatus.DISPATCHED
    assert state.active_run.attempt_started_ms == state.active_run.last_heartbeat_ms == 1_000
    assert state.last_run is None
    assert state.idempotency == {}


def test_an_idempotency_key_is_recorded_with_the_payload_fingerprint() -> None:
    """A message's idempotency key is kept with its message, run and text fingerprint."""
    state = apply(None, [created(), *accepted(key="k-1")])
    assert state is not None
    assert state.idempotency == {
        "k-1": IdempotencyRecord(
            message_id="m-1", run_id=RUN1, payload_fingerprint=payload_fingerprint("hello"),
            at_ms=1_000,
        )
    }


def test_a_message_to_a_missing_thread_is_rejected() -> None:
    """Posting to a thread that does not exist is rejected as unknown_thread."""
    given([]).when(post()).then([rejected(RejectReason.UNKNOWN_THREAD, None)])


def test_a_message_from_another_tenant_is_rejected_as_unknown_thread() -> None:
    """Another tenant cannot post to the thread: it is told the thread is unknown."""
    given([created()]).when(post(tenant="evil")).then([rejected(RejectReason.UNKNOWN_THREAD, None)])


def test_a_message_routed_to_the_wrong_thread_is_rejected_as_unknown_thread() -> None:
    """A command that names another thread than the state's is rejected as unknown_thread."""
    misrouted = replace(post(), thread_id="t-2")
    expected = replace(rejected(RejectReason.UNKNOWN_THREAD, None), thread_id="t-2")
    given([created()]).when(misrouted).then([expected])


@pytest.mark.parametrize("text", ["", "   ", "\n\t \u2003"])
def test_an_empty_message_is_invalid(text: str) -> None:
    """A message of only whitespace is rejected as invalid."""
    expected = replace(rejected(RejectReason.INVALID, None), detail=containing("empty"))
    given([created()]).when(post(text=text)).then([expected])


def test_a_message_over_the_limit_is_invalid_and_one_at_the_limit_is_accepted() -> None:
    """max_input_chars is inclusive: one character more is invalid."""
    policy = Policy(max_input_chars=10)
    expected = replace(rejected(RejectReason.INVALID, None), detail=containing("limit is 10"))
    given([created()], policy).when(post(text="x" * 11)).then([expected])
    given([created()], policy).when(post(text="x" * 10, now=1_000)).then(
        accepted(text="x" * 10, at=1_000)
    )


def test_a_repeated_idempotency_key_with_the_same_payload_is_a_duplicate() -> None:
    """Reusing a key with the same text is a duplicate that names the original run."""
    history = [created(), *accepted(key="k-1"), completed_event()]
    given(history).when(post(message_id="m-9", key="k-1", now=9_000)).then(
        [rejected(RejectReason.DUPLICATE, RUN1, message_id="m-9", at=9_000)]
    )


def test_a_repeated_idempotency_key_with_another_payload_is_a_mismatch() -> None:
    """Reusing a key with other text is rejected as payload_mismatch."""
    history = [created(), *accepted(key="k-1"), completed_event()]
    given(history).when(post(message_id="m-9", text="bye", key="k-1", now=9_000)).then(
        [rejected(RejectReason.PAYLOAD_MISMATCH, RUN1, message_id="m-9", at=9_000)]
    )


def test_a_repeated_idempotency_key_is_a_duplicate_even_while_its_run_is_active() -> None:
    """A reused key is a duplicate, not a conflict, while its own run still runs."""
    given([created(), *accepted(key="k-1")]).when(post(message_id="m-9", key="k-1")).then(
        [rejected(RejectReason.DUPLICATE, RUN1, message_id="m-9")]
    )


def test_a_repeated_message_id_is_a_duplicate_even_while_its_run_is_active() -> None:
    """A resent message id is a duplicate, not a conflict, while its run still runs."""
    given(RUNNING).when(post()).then([rejected(RejectReason.DUPLICATE, RUN1)])


def test_a_repeated_message_id_after_its_run_ended_is_a_duplicate() -> None:
    """A resent message id is a duplicate after its run ended, even with other text."""
    given([*RUNNING, completed_event()]).when(post(text="other text")).then(
        [rejected(RejectReason.DUPLICATE, RUN1)]
    )


def test_another_message_while_a_run_is_active_is_a_conflict() -> None:
    """A new message while a run is active is rejected as a conflict naming that run."""
    given(RUNNING).when(post(message_id="m-2", key="k-2")).then(
        [rejected(RejectReason.CONFLICT, RUN1, message_id="m-2")]
    )


def test_a_conflict_does_not_burn_the_idempotency_key() -> None:
    """A message refused for a conflict can be posted again with its key once the run ends."""
    history = [*RUNNING, RunRejected(T, "m-2", RejectReason.CONFLICT, "busy", RUN1, 2_000)]
    given([*history, completed_event()]).when(post(message_id="m-2", key="k-2", now=6_000)).then(
        accepted(message_id="m-2", key="k-2", at=6_000)
    )


def test_a_rejection_changes_nothing() -> None:
    """Applying a rejection event leaves the state (or its absence) as it was."""
    state = apply(None, RUNNING)
    rejection = RunRejected(T, "m-2", RejectReason.CONFLICT, "busy", RUN1, 2_000)
    assert evolve(state, rejection) == state
    assert evolve(None, rejection) is None


# --- 3. worker reports, fenced by the attempt ---------------------------------------


def test_attempt_started_moves_dispatched_to_running() -> None:
    """A worker's started report moves the run to running and counts as a heartbeat."""
    state = (
        given(RUNNING)
        .when(started(now=2_000))
        .then([AttemptStarted(thread_id=T, run_id=RUN1, attempt=1, worker_id="w-1", at_ms=2_000)])
    )
    assert state is not None and state.active_run is not None
    assert state.active_run.status is RunStatus.RUNNING
    assert state.active_run.last_heartbeat_ms == 2_000


def test_attempt_started_again_is_idempotent() -> None:
    """A second started report for the same attempt decides nothing."""
    history = [*RUNNING, AttemptStarted(T, RUN1, 1, "w-1", 2_000)]
    given(history).when(started(now=2_500)).then([])


def test_a_heartbeat_is_recorded_and_a_redelivered_or_older_one_is_not() -> None:
    """A newer heartbeat is recorded; a repeated or older one decides nothing."""
    state = (
        given(RUNNING)
        .when(heartbeat(now=3_000))
        .then([HeartbeatRecorded(thread_id=T, run_id=RUN1, attempt=1, at_ms=3_000)])
    )
    assert state is not None and state.active_run is not None
    assert state.active_run.last_heartbeat_ms == 3_000
    history = [*RUNNING, HeartbeatRecorded(T, RUN1, 1, 3_000)]
    given(history).when(heartbeat(now=3_000)).then([])
    given(history).when(heartbeat(now=2_500)).then([])


def test_a_late_stamped_report_never_moves_the_last_heartbeat_back() -> None:
    """Reports stamped before the last heartbeat never move it back in time."""
    state = given(RUNNING).when(started(now=500)).then([AttemptStarted(T, RUN1, 1, "w-1", 500)])
    assert state is not None and state.active_run is not None
    assert state.active_run.last_heartbeat_ms == 1_000
    older = evolve(state, HeartbeatRecorded(T, RUN1, 1, 700))  # e.g. from a recorded log
    assert older is not None and older.active_run is not None
    assert older.active_run.last_heartbeat_ms == 1_000


def test_completion_ends_the_run_with_the_assistant_answer() -> None:
    """A completed report ends the run and stores the answer as the thread's next message."""
    state = (
        given([*RUNNING, AttemptStarted(T, RUN1, 1, "w-1", 2_000)])
        .when(complete(now=5_000))
        .then([completed_event(at=5_000)])
    )
    assert state is not None
    assert state.active_run is None
    assert state.last_run == RunRecord(RUN1, "m-1", RunStatus.COMPLETED, 1)
    assert state.message_count == 2  # the question and its answer
    assert answer_message_id_for(RUN1) != answer_message_id_for(RUN2)


def test_completion_is_accepted_even_if_the_started_report_never_arrived() -> None:
    """A run completes from dispatched, with no started report seen."""
    given(RUNNING).when(complete()).then([completed_event()])


def test_a_retryable_failure_schedules_the_next_attempt_after_the_backoff() -> None:
    """A retryable failure waits the 2 s backoff before the next attempt."""
    state = given(RUNNING).when(fail(now=5_000)).then([retry(failed=1, at=5_000, due=7_000)])
    assert state is not None and state.active_run is not None
    assert state.active_run.status is RunStatus.RETRY_WAIT
    assert state.active_run.retry_due_ms == 7_000


def test_a_retryable_failure_of_the_last_attempt_fails_the_run() -> None:
    """A failure of the last allowed attempt fails the run and stores no answer."""
    state = (
        given(ATTEMPT_2)
        .when(fail(attempt=2, now=8_000))
        .then([RunFailed(thread_id=T, run_id=RUN1, attempt=2, error="boom", at_ms=8_000)])
    )
    assert state is not None and state.active_run is None
    assert state.last_run == RunRecord(RUN1, "m-1", RunStatus.FAILED, 2)
    assert state.message_count == 1  # no answer stored


def test_a_non_retryable_failure_fails_the_run_at_once() -> None:
    """A non-retryable failure fails the run with no further attempt."""
    given(RUNNING).when(fail(retryable=False)).then(
        [RunFailed(thread_id=T, run_id=RUN1, attempt=1, error="boom", at_ms=5_000)]
    )


def test_backoff_doubles_from_two_seconds_and_is_capped_at_thirty() -> None:
    """The backoff is 2, 4, 8, 16 s, then 30 s for every later attempt."""
    assert [POLICY.backoff_ms(n) for n in range(1, 8)] == [
        2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000
    ]  # fmt: skip


def test_each_retry_waits_the_backoff_of_the_attempt_that_failed() -> None:
    """Over seven attempts, each retry is due one backoff (of the failed attempt) later."""
    policy = replace(POLICY, max_attempts=7)
    state = apply(None, RUNNING)
    delays = []
    now = 1_000
    for attempt in range(1, 8):
        events = decide(state, fail(attempt=attempt, now=now), policy)
        state = apply(state, events)
        if attempt == 7:
            assert events == [RunFailed(T, RUN1, 7, "boom", now)]
            break
        [scheduled] = events
        assert isinstance(scheduled, RetryScheduled)
        assert (scheduled.failed_attempt, scheduled.next_attempt) == (attempt, attempt + 1)
        delays.append(scheduled.due_ms - now)
        now = scheduled.due_ms
        state = apply(state, decide(state, tick(now), policy))
    assert delays == [2_000, 4_000, 8_000, 16_000, 30_000, 30_000]


def test_backoff_stays_capped_where_the_float_math_overflows() -> None:
    """At attempt 2,000 the backoff math overflows, yet the retry is still due 30 s later."""
    policy = Policy(max_attempts=5_000)
    with pytest.raises(OverflowError):
        policy.backoff_ms(2_000)
    history = [*RUNNING, dispatched(attempt=2_000, at=1_000)]
    given(history, policy).when(fail(attempt=2_000, now=9_000)).then(
        [retry(failed=2_000, at=9_000, due=39_000)]
    )


STALE_REPORTS = [
    started(attempt=1, now=8_000),
    heartbeat(attempt=1, now=8_000),
    complete(attempt=1, now=8_000),
    fail(attempt=1, now=8_000),
    fail(attempt=1, now=8_000, retryable=False),
]


@pytest.mark.parametrize("report", STALE_REPORTS, ids=lambda report: type(report).__name__)
def test_reports_of_a_superseded_attempt_are_fenced_off(report: Command) -> None:
    """Reports from attempt 1 change nothing once attempt 2 runs."""
    given(ATTEMPT_2).when(report).then([])


@pytest.mark.parametrize("report", STALE_REPORTS, ids=lambda report: type(report).__name__)
def test_reports_of_an_attempt_already_given_up_on_are_ignored(report: Command) -> None:
    """Reports from a failed attempt change nothing while its retry waits."""
    given(IN_RETRY).when(report).then([])


@pytest.mark.parametrize(
    "report",
    [
        started(attempt=2),
        heartbeat(attempt=2),
        complete(attempt=2),
        fail(attempt=0),
        complete(run_id="no-such-run"),
        fail(run_id=RUN2),
    ],
    ids=repr,
)
def test_reports_naming_another_attempt_or_run_are_ignored(report: Command) -> None:
    """Reports for an attempt or run other than the active one change nothing."""
    given(RUNNING).when(report).then([])


@pytest.mark.parametrize(
    "report", [started(), heartbeat(), complete(), fail()], ids=lambda report: type(report).__name__
)
def test_reports_to_a_missing_thread_are_ignored(report: Command) -> None:
    """Worker reports to a thread that does not exist decide nothing."""
    given([]).when(report).then([])


# --- 4. deadlines -------------------------------------------------------------------


def test_a_silent_attempt_times_out_one_millisecond_after_the_heartbeat_timeout() -> None:
    """An attempt with no heartbeat for 60 s is retried at 60 s + 1 ms, not before."""
    assert next_deadline_ms(apply(None, RUNNING), POLICY) == 61_001
    given(RUNNING).when(tick(61_000)).then([])
    given(RUNNING).when(tick(61_001)).then(
        [retry(failed=1, at=61_001, due=63_001, reason="heartbeat_timeout")]
    )


def test_a_heartbeat_timeout_of_the_last_attempt_fails_the_run() -> None:
    """A heartbeat timeout on the last attempt fails the run."""
    given(ATTEMPT_2).when(tick(67_001)).then(
        [RunFailed(thread_id=T, run_id=RUN1, attempt=2, error="heartbeat_timeout", at_ms=67_001)]
    )


def test_heartbeats_keep_an_attempt_alive() -> None:
    """A heartbeat pushes the heartbeat deadline to 60 s after it."""
    history = [*RUNNING, HeartbeatRecorded(T, RUN1, 1, 50_000)]
    assert next_deadline_ms(apply(None, history), POLICY) == 110_001
    given(history).when(tick(61_001)).then([])


def test_an_attempt_that_heartbeats_forever_still_times_out() -> None:
    """An attempt is retried after 300 s in all, however often it heartbeats."""
    history = [*RUNNING, AttemptStarted(T, RUN1, 1, "w-1", 2_000)]
    history += [HeartbeatRecorded(T, RUN1, 1, at) for at in range(50_000, 300_001, 50_000)]
    assert next_deadline_ms(apply(None, history), POLICY) == 301_001
    given(history).when(tick(301_000)).then([])
    given(history).when(tick(301_001)).then(
        [retry(failed=1, at=301_001, due=303_001, reason="attempt_timeout")]
    )


def test_the_next_attempt_is_dispatched_when_the_retry_is_due() -> None:
    """The next attempt is dispatched by the first tick at or after the retry's due time."""
    assert next_deadline_ms(apply(None, IN_RETRY), POLICY) == 7_000
    given(IN_RETRY).when(tick(6_999)).then([])
    state = given(IN_RETRY).when(tick(7_000)).then([dispatched(attempt=2, at=7_000)])
    assert state is not None and state.active_run is not None
    assert (state.active_run.attempt, state.active_run.status) == (2, RunStatus.DISPATCHED)
    assert state.active_run.attempt_started_ms == state.active_run.last_heartbeat_ms == 7_000
    assert state.active_run.retry_due_ms is None


def test_a_retry_due_after_max_attempts_was_lowered_fails_the_run() -> None:
    """A retry that is due after max_attempts was lowered fails the run instead."""
    given(IN_RETRY, Policy(max_attempts=1)).when(tick(7_000)).then(
        [RunFailed(T, RUN1, 1, "attempts exhausted", 7_000)]
    )


@pytest.mark.parametrize(
    "history",
    [[], [created()], [*RUNNING, completed_event()]],
    ids=["no-thread", "no-run", "ended-run"],
)
def test_without_an_active_run_there_is_no_deadline(history: list[Event]) -> None:
    """Without an active run there is no deadline and a tick decides nothing."""
    assert next_deadline_ms(apply(None, history), POLICY) is None
    given(history).when(tick(10**12)).then([])


# --- 5. cancel, and running again ---------------------------------------------------


@pytest.mark.parametrize(
    "history", [RUNNING, IN_RETRY, ATTEMPT_2], ids=["attempt-1", "retry-wait", "attempt-2"]
)
def test_the_active_run_can_be_cancelled(history: list[Event]) -> None:
    """The active run can be cancelled in any attempt or while a retry waits, leaving no deadline."""
    state = (
        given(history)
        .when(cancel(now=9_000))
        .then([RunCancelled(thread_id=T, run_id=RUN1, reason="user", at_ms=9_000)])
    )
    assert state is not None and state.active_run is None
    assert state.last_run is not None and state.last_run.status is RunStatus.CANCELLED
    assert next_deadline_ms(state, POLICY) is None


@pytest.mark.parametrize(
    ("history", "command"),
    [
        (RUNNING, cancel(tenant="evil")),
        (RUNNING, cancel(run_id=RUN2)),
        ([*RUNNING, completed_event()], cancel()),
        ([created()], cancel()),
        ([], cancel()),
    ],
    ids=["other-tenant", "other-run", "ended-run", "no-run", "no-thread"],
)
def test_cancel_of_anything_but_the_active_run_does_nothing(
    history: list[Event], command: CancelRun
) -> None:
    """Cancelling another tenant's, another, an ended or a missing run decides nothing."""
    given(history).when(command).then([])


ENDINGS = {
    "completed": completed_event(at=5_000),
    "failed": RunFailed(T, RUN1, 1, "boom", 5_000),
    "cancelled": RunCancelled(T, RUN1, "user", 5_000),
}


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_after_a_run_ends_the_thread_runs_again(ending: Event) -> None:
    """Once a run ends, however it ended, the thread accepts the next message."""
    given([*RUNNING, ending]).when(post(message_id="m-2", now=6_000)).then(
        accepted(message_id="m-2", at=6_000)
    )


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
@pytest.mark.parametrize(
    "report", [started(), heartbeat(), complete(), fail()], ids=lambda report: type(report).__name__
)
def test_late_reports_for_an_ended_run_change_nothing(ending: Event, report: Command) -> None:
    """Reports for an ended run change nothing, even once the next run is on attempt 1."""
    given([*RUNNING, ending]).when(report).then([])
    # Nor once the next run is on attempt 1 too: the run id fences them.
    given([*RUNNING, ending, *accepted(message_id="m-2", at=6_000)]).when(report).then([])


# --- 5b. double-texting: multitask_strategy -----------------------------------------

ENQUEUE, INTERRUPT, ROLLBACK = (MultitaskStrategy.ENQUEUE, MultitaskStrategy.INTERRUPT,
                                MultitaskStrategy.ROLLBACK)


def queued_event(message_id: str = "m-2", ahead: int = 0, at: int = 2_000) -> list[Event]:
    """The events of a message stored and queued behind the active run."""
    return [MessageAccepted(thread_id=T, message_id=message_id, text="hello", idempotency_key=None,
                            at_ms=at),
            MessageQueued(thread_id=T, message_id=message_id, ahead=ahead, at_ms=at)]


def started_run(message_id: str, at: int) -> list[Event]:
    """RunAccepted and its first dispatch, for a message stored earlier."""
    return accepted(message_id, at=at)[1:]


def test_reject_is_the_default_and_a_conflict() -> None:
    """Without a strategy a post while a run is active is a conflict, as before."""
    given(RUNNING).when(post("m-2", strategy=MultitaskStrategy.REJECT)).then(
        [rejected(RejectReason.CONFLICT, RUN1, "m-2")])


def test_enqueue_stores_the_message_and_queues_it_behind_the_active_run() -> None:
    """enqueue: MessageAccepted and MessageQueued; no run starts, the state keeps its place."""
    state = given(RUNNING).when(post("m-2", strategy=ENQUEUE)).then(queued_event("m-2"))
    assert state is not None and state.active_run is not None
    assert state.active_run.run_id == RUN1
    assert state.queued == (QueuedMessage("m-2", 1, 2_000),)
    state = given([*RUNNING, *queued_event("m-2")]).when(post("m-3", strategy=ENQUEUE, now=2_500)) \
        .then(queued_event("m-3", ahead=1, at=2_500))
    assert state is not None and [q.message_id for q in state.queued] == ["m-2", "m-3"]


def test_enqueue_on_an_idle_thread_runs_at_once() -> None:
    """With no active run, every strategy just runs the message."""
    for strategy in MultitaskStrategy:
        given([created()]).when(post("m-1", strategy=strategy, now=1_000)).then(accepted())


@pytest.mark.parametrize("ending", [complete(), fail(retryable=False), cancel(), tick(10**9)],
                         ids=["completed", "failed", "cancelled", "timed-out"])
def test_the_oldest_queued_message_runs_when_the_active_run_ends(ending: Command) -> None:
    """Whatever ends the run, the same decision starts the head of the queue."""
    policy = replace(POLICY, max_attempts=1)  # so a timeout ends the run
    history = [*RUNNING, *queued_event("m-2"), *queued_event("m-3", ahead=1)]
    state = apply(initial_state(), history, policy)
    events = decide(state, ending, policy)
    assert len(events) == 3 and isinstance(events[0], RunCompleted | RunFailed | RunCancelled)
    assert events[1:] == started_run("m-2", ending.now_ms)
    after = apply(state, events, policy)
    assert after is not None and after.active_run is not None
    assert after.active_run.message_seq == 1  # where m-2 was stored, not the newest seq
    assert [q.message_id for q in after.queued] == ["m-3"]


def test_a_full_queue_rejects_as_a_conflict() -> None:
    """The queue is capped by Policy.max_queued_messages: past it, enqueue is a conflict."""
    policy = replace(POLICY, max_queued_messages=1)
    given([*RUNNING, *queued_event("m-2")], policy).when(post("m-3", strategy=ENQUEUE)).then(
        [rejected(RejectReason.CONFLICT, RUN1, "m-3")])


@pytest.mark.parametrize(("strategy", "reason"), [(INTERRUPT, CancelReason.INTERRUPTED),
                                                  (ROLLBACK, CancelReason.ROLLED_BACK)])
def test_interrupt_and_rollback_cancel_the_active_run_before_the_new_one_starts(
        strategy: MultitaskStrategy, reason: str) -> None:
    """The active run ends run_cancelled (marked with why), then the new message runs."""
    message, *run = accepted("m-2", at=2_000)
    state = given(RUNNING).when(post("m-2", strategy=strategy)).then(
        [message, RunCancelled(thread_id=T, run_id=RUN1, reason=reason, at_ms=2_000), *run])
    assert state is not None and state.active_run is not None
    assert state.active_run.run_id == RUN2 and state.active_run.message_seq == 1
    assert state.last_run == RunRecord(RUN1, "m-1", RunStatus.CANCELLED, 1)


INTERRUPTED_RUN1 = [*RUNNING, *accepted("m-2", at=2_000)[:1],
                   RunCancelled(thread_id=T, run_id=RUN1, reason=CancelReason.INTERRUPTED, at_ms=2_000),
                   *accepted("m-2", at=2_000)[1:]]


def partial_stored(attempt: int = 1, at: int = 5_000) -> PartialAnswerStored:
    """The event storing run 1's partial answer (what `complete` reports)."""
    return PartialAnswerStored(thread_id=T, run_id=RUN1, attempt=attempt, message=AssistantMessage(
        message_id=answer_message_id_for(RUN1), text="answer", steps=STEPS, citations=CITATIONS),
        at_ms=at)


def test_the_interrupted_attempts_report_stores_its_partial_answer_once() -> None:
    """After an interrupt, the stopped attempt's completion report is its partial
    answer: stored (a message, marked), once; the new run goes on untouched."""
    state = given(INTERRUPTED_RUN1).when(complete()).then([partial_stored()])
    assert state is not None and state.interrupted is None and state.message_count == 3
    assert state.active_run is not None and state.active_run.run_id == RUN2
    given([*INTERRUPTED_RUN1, partial_stored()]).when(complete()).then([])


@pytest.mark.parametrize("report", [complete(attempt=2), complete(run_id=RUN2, attempt=2),
                                    replace(complete(), final_text="", steps=(), citations=())],
                         ids=["another-attempt", "another-run", "empty"])
def test_no_partial_answer_from_another_attempt_or_an_empty_one(report: Command) -> None:
    """Only the attempt that was running, with something to show, is stored."""
    given(INTERRUPTED_RUN1).when(report).then([])


@pytest.mark.parametrize("ending", [cancel(), post("m-2", strategy=ROLLBACK)],
                         ids=["cancelled", "rolled-back"])
def test_a_cancelled_or_rolled_back_run_stores_no_partial_answer(ending: Command) -> None:
    """A cancel and a rollback keep nothing of the run's answer."""
    state = apply(initial_state(), RUNNING)
    after = apply(state, decide(state, ending, POLICY))
    assert after is not None and after.interrupted is None
    assert not [e for e in decide(after, complete(), POLICY) if isinstance(e, PartialAnswerStored)]


def test_an_interrupt_jumps_the_queue_and_the_queue_keeps_its_order() -> None:
    """Queued messages stay queued behind the interrupting one."""
    history = [*RUNNING, *queued_event("m-2")]
    state = apply(initial_state(), history)
    events = decide(state, post("m-3", strategy=INTERRUPT, now=3_000), POLICY)
    after = apply(state, events)
    assert after is not None and after.active_run is not None
    assert after.active_run.message_id == "m-3"
    assert [q.message_id for q in after.queued] == ["m-2"]
    ended = decide(after, complete(run_id=run_id_for(T, "m-3"), now=4_000), POLICY)
    assert ended[-2:] == started_run("m-2", 4_000)


@pytest.mark.parametrize("strategy", list(MultitaskStrategy))
def test_an_idempotent_repeat_decides_only_a_duplicate_whatever_the_strategy(
        strategy: MultitaskStrategy) -> None:
    """A repeated key or message id never cancels, queues or runs anything."""
    history = [created(), *accepted(key="k")]
    given(history).when(post("m-1", key="k", strategy=strategy)).then(
        [rejected(RejectReason.DUPLICATE, RUN1)])
    given(history).when(post("m-1", strategy=strategy)).then(
        [rejected(RejectReason.DUPLICATE, RUN1)])
    queued = [*RUNNING, *queued_event("m-2")]
    given(queued).when(post("m-2", strategy=strategy)).then(
        [rejected(RejectReason.DUPLICATE, RUN2, "m-2")])


def test_a_rolled_back_message_id_posted_again_is_a_duplicate() -> None:
    """Its record is tombstoned, so the history no longer knows it; the state does."""
    message, *run = accepted("m-2", at=2_000)
    cancelled = RunCancelled(thread_id=T, run_id=RUN1, reason=CancelReason.ROLLED_BACK, at_ms=2_000)
    history = [*RUNNING, message, cancelled, *run, completed_event(run_id=RUN2)]
    given(history).when(post("m-1", now=6_000)).then(
        [rejected(RejectReason.DUPLICATE, RUN1, "m-1", at=6_000)])


def test_a_cancel_cannot_pass_for_a_rollback() -> None:
    """A CancelRun whose reason reads like a double text's is only a cancel."""
    given(RUNNING).when(CancelRun(T, TENANT, RUN1, "rolled_back", 4_000)).then(
        [RunCancelled(thread_id=T, run_id=RUN1, reason="cancel: rolled_back", at_ms=4_000)])


def test_deleting_a_thread_drops_its_queue() -> None:
    """A deleted thread starts nothing from its queue."""
    given([*RUNNING, *queued_event("m-2")]).when(DeleteThread(T, TENANT, 3_000)).then([
        RunCancelled(thread_id=T, run_id=RUN1, reason="thread deleted", at_ms=3_000),
        ThreadDeleted(thread_id=T, tenant=TENANT, message_count=2, at_ms=3_000)])


# --- 6. ids and immutability --------------------------------------------------------


def test_run_ids_are_deterministic_uuid5s_and_distinct() -> None:
    """Run ids are UUID5s of thread and message, distinct per pair, with no separator clashes."""
    assert run_id_for(T, "m-1") == RUN1
    assert uuid.UUID(RUN1).version == 5
    assert len({RUN1, RUN2, run_id_for("t-2", "m-1")}) == 3
    assert run_id_for("a:b", "c") != run_id_for("a", "b:c")


def test_payload_fingerprint_is_sha256_hex() -> None:
    """A message's fingerprint is the SHA-256 hex of its exact text."""
    assert payload_fingerprint("hello") == hashlib.sha256(b"hello").hexdigest()
    assert payload_fingerprint("hello") != payload_fingerprint("hello ")


def test_strings_that_are_not_valid_utf8_do_not_break_the_decider() -> None:
    """Ids, keys and text with lone surrogates are accepted and get distinct run ids."""
    odd = "\ud800 lone surrogate"
    state = (
        given([created()])
        .when(post(message_id=odd, text=odd, key=odd, now=1_000))
        .then(accepted(message_id=odd, text=odd, key=odd, at=1_000))
    )
    assert state is not None and state.active_run is not None
    assert state.active_run.run_id == run_id_for(T, odd) != run_id_for(T, "\ud801 lone surrogate")


def test_states_are_never_mutated_in_place() -> None:
    """Applying events returns new states; old states and their idempotency maps never change."""
    before = apply(None, RUNNING)
    snapshot = repr(before)
    after = apply(before, [AttemptStarted(T, RUN1, 1, "w", 2_000), completed_event()])
    assert repr(before) == snapshot
    assert before != after
    assert after is not None
    keyed = apply(None, [created(), *accepted(key="k")])
    assert keyed is not None
    with pytest.raises(TypeError):
        keyed.idempotency["k2"] = keyed.idempotency["k"]  # type: ignore[index]


# --- properties -----------------------------------------------------------------------

MESSAGE_IDS = ("m1", "m2", "m3", "m4", "m5", "m6")
KEYS = (None, "k1", "k2")
TEXTS = ("hi", "hello", "hi", "hello", " ", "toolongtext")  # max_input_chars is 8
TERMINAL = (RunCompleted, RunFailed, RunCancelled)

small_policies = st.builds(
    Policy,
    max_attempts=st.integers(1, 3),
    backoff_initial_ms=st.integers(1, 500),
    backoff_multiplier=st.sampled_from([1.0, 2.0, 3.5]),
    backoff_max_ms=st.integers(1, 2_000),
    heartbeat_timeout_ms=st.integers(1, 2_000),
    attempt_timeout_ms=st.integers(1, 5_000),
    max_input_chars=st.just(8),
    max_queued_messages=st.sampled_from([0, 2, 3, 3]),  # 0: every enqueue is a conflict
)
clock_steps = st.integers(0, 200) | st.integers(0, 5_000)
report_kinds = st.sampled_from(["started", "heartbeat", "completed", "failed"])


class ThreadMachine(RuleBasedStateMachine):
    """One thread under random commands, with workers that lie, repeat and vanish."""

    # Indirection so that test_the_invariants_catch_a_broken_decider can swap in mutants.
    decide_fn = staticmethod(decide)
    deadline_fn = staticmethod(next_deadline_ms)

    def __init__(self) -> None:
        super().__init__()
        self.policy = POLICY
        self.now = 0
        self.state: ThreadState | None = initial_state()
        self.commands: list[Command] = []
        self.events: list[Event] = []
        self.reports: list[Command] = []
        self.open_runs: set[str] = set()
        self.accepted_runs: list[str] = []
        self.terminals: dict[str, int] = {}
        self.attempts: dict[str, int] = {}
        self.enqueued: list[str] = []  # message ids in MessageQueued order
        self.started_from_queue: list[str] = []  # the queued ones, in RunAccepted order
        self.message_of_run: dict[str, str] = {}
        self.interrupted_at: dict[str, int] = {}  # interrupted run -> its attempt then
        self.partials: set[str] = set()  # runs whose partial answer was stored
        self.healthy = True  # False while a step is half done: teardown then checks nothing

    @initialize(policy=small_policies)
    def start(self, policy: Policy) -> None:
        """Begin with thread T created under a drawn policy."""
        # The thread exists from the start: commands to missing threads are covered above.
        self.policy = policy
        self.execute(CreateThread(T, TENANT, "title", self.now))

    def execute(self, command: Command) -> list[Event]:
        """Decide and apply one command, checking that nothing was mutated and rejections change nothing."""
        self.healthy = False
        before, snapshot = self.state, repr(self.state)
        events = self.decide_fn(before, command, self.policy, known_for(self.events, command))
        after = apply(before, events, self.policy)
        assert repr(before) == snapshot, "decide or evolve mutated the state"
        if all(isinstance(event, RunRejected) for event in events):
            assert after == before
        for event in events:
            self.record(event)
        self.commands.append(command)
        self.events.extend(events)
        self.state = after
        self.healthy = True
        return events

    def record(self, event: Event) -> None:
        """Track run lifecycles from one event, asserting at most one open run and one ending each."""
        if isinstance(event, MessageQueued):
            assert event.message_id not in self.enqueued, "a message was queued twice"
            assert self.open_runs, "a message was queued with no run active"
            self.enqueued.append(event.message_id)
        elif isinstance(event, RunAccepted):
            assert event.run_id not in self.terminals, "a run was accepted twice"
            if event.message_id in self.enqueued:
                assert event.message_id not in self.started_from_queue, "a queued message ran twice"
                self.started_from_queue.append(event.message_id)
                assert self.started_from_queue == self.enqueued[:len(self.started_from_queue)], \
                    "queued messages ran out of order"
            self.message_of_run[event.run_id] = event.message_id
            self.open_runs.add(event.run_id)
            self.accepted_runs.append(event.run_id)
            self.terminals[event.run_id] = 0
            self.attempts[event.run_id] = 0
        elif isinstance(event, AttemptDispatched):
            assert event.run_id in self.open_runs
            assert event.attempt == self.attempts[event.run_id] + 1
            assert event.attempt <= self.policy.max_attempts, "attempt beyond max_attempts"
            self.attempts[event.run_id] = event.attempt
        elif isinstance(event, RetryScheduled):
            assert event.next_attempt <= self.policy.max_attempts, "retry beyond max_attempts"
            assert event.due_ms >= event.at_ms
        elif isinstance(event, TERMINAL):
            assert event.run_id in self.open_runs, "terminal event for a run that is not open"
            self.open_runs.remove(event.run_id)
            self.terminals[event.run_id] += 1
            if isinstance(event, RunCancelled) and event.reason == CancelReason.INTERRUPTED:
                self.interrupted_at[event.run_id] = self.attempts[event.run_id]
        elif isinstance(event, PartialAnswerStored):
            assert event.run_id in self.interrupted_at, "a partial answer of a run not interrupted"
            assert event.attempt == self.interrupted_at[event.run_id], "of another attempt"
            assert event.run_id not in self.partials, "a partial answer stored twice"
            assert event.message.text, "an empty partial answer"
            self.partials.add(event.run_id)
            hypothesis.event("a partial answer stored")
        assert len(self.open_runs) <= 1, "two active runs"

    # --- the gateway and the clock

    @rule(
        message_id=st.sampled_from(MESSAGE_IDS),
        key=st.sampled_from(KEYS),
        text=st.sampled_from(TEXTS),
        tenant=st.sampled_from([TENANT, TENANT, TENANT, TENANT, "evil"]),
        # enqueue twice as often: a queue two deep is what the order properties need
        strategy=st.sampled_from([*MultitaskStrategy, MultitaskStrategy.ENQUEUE]),
        dt=clock_steps,
    )
    def post_message(self, message_id: str, key: str | None, text: str, tenant: str,
                     strategy: MultitaskStrategy, dt: int) -> None:
        """Rule: post a message with a multitask strategy (sometimes as another tenant,
        with reused ids and keys)."""
        self.now += dt
        events = self.execute(PostUserMessage(T, tenant, message_id, text, key, self.now, strategy))
        # An interrupted or rolled-back run ends run_cancelled before the next starts.
        cancelled = [i for i, e in enumerate(events) if isinstance(e, RunCancelled)]
        runs = [i for i, e in enumerate(events) if isinstance(e, RunAccepted)]
        if cancelled:
            assert strategy in (MultitaskStrategy.INTERRUPT, MultitaskStrategy.ROLLBACK)
            assert runs and cancelled[0] < runs[0], "the next run started before the cancel"

    @rule(dt=clock_steps)
    def clock_tick(self, dt: int) -> None:
        """Rule: move the clock on and check deadlines."""
        self.now += dt
        self.execute(tick(self.now))

    @rule(
        which=st.sampled_from(["active", "known", "unknown"]),
        tenant=st.sampled_from([TENANT, TENANT, "evil"]),
        dt=clock_steps,
    )
    def cancel_run(self, which: str, tenant: str, dt: int) -> None:
        """Rule: cancel the active, the last known or an unknown run."""
        self.now += dt
        self.execute(CancelRun(T, tenant, self.pick_run(which), "user", self.now))

    # --- the workers

    @precondition(lambda self: self.state is not None and self.state.active_run is not None)
    @rule(kind=report_kinds, retryable=st.booleans(), dt=clock_steps)
    def worker_report(self, kind: str, retryable: bool, dt: int) -> None:
        """Rule: a worker reports on the active attempt."""
        assert self.state is not None and self.state.active_run is not None
        active = self.state.active_run
        self.report(kind, active.run_id, active.attempt, retryable, dt)

    @rule(
        kind=report_kinds,
        which=st.sampled_from(["active", "known", "interrupted", "unknown"]),
        attempt_offset=st.sampled_from([-1, 0, 1]),
        retryable=st.booleans(),
        dt=clock_steps,
    )
    def stray_report(
        self, kind: str, which: str, attempt_offset: int, retryable: bool, dt: int
    ) -> None:
        """Rule: a report on a neighbouring attempt of the active, a known or an unknown run."""
        active = self.state.active_run if self.state is not None else None
        attempt = (active.attempt if active is not None else 1) + attempt_offset
        self.report(kind, self.pick_run(which), attempt, retryable, dt)

    def report(self, kind: str, run_id: str, attempt: int, retryable: bool, dt: int) -> None:
        """Send one worker report of this kind, and keep it for redelivery."""
        self.now += dt
        report: Command
        if kind == "started":
            report = ReportAttemptStarted(T, run_id, attempt, "w", self.now)
        elif kind == "heartbeat":
            report = ReportHeartbeat(T, run_id, attempt, "w", self.now)
        elif kind == "completed":
            report = ReportAttemptCompleted(T, run_id, attempt, "w", "ok", (), (), self.now)
        else:
            report = ReportAttemptFailed(T, run_id, attempt, "w", "boom", retryable, self.now)
        self.reports.append(report)
        self.execute(report)

    @precondition(lambda self: bool(self.reports))
    @rule(data=st.data())
    def redeliver_an_old_report(self, data: st.DataObject) -> None:
        """Rule: redeliver an earlier report as it was, out of order."""
        report = data.draw(st.sampled_from(self.reports))
        self.execute(report)  # as it was, clock and all: a redelivery arriving out of order

    def pick_run(self, which: str) -> str:
        """A run id: the active run's, the last accepted one's, or one never posted."""
        active = self.state.active_run if self.state is not None else None
        if which == "active" and active is not None:
            return active.run_id
        if which == "interrupted" and self.interrupted_at:
            return list(self.interrupted_at)[-1]
        if which in ("active", "known", "interrupted") and self.accepted_runs:
            return self.accepted_runs[-1]
        return run_id_for(T, "never-posted")

    # --- invariants

    @invariant()
    def state_agrees_with_the_event_log(self) -> None:
        """Invariant: the state's active run, attempts and counters match the events so far."""
        self.healthy = False
        active = self.state.active_run if self.state is not None else None
        assert ({active.run_id} if active is not None else set()) == self.open_runs
        if active is not None and self.state is not None:
            assert active.attempt == self.attempts[active.run_id]
            assert 1 <= active.attempt <= self.policy.max_attempts, "attempt beyond max_attempts"
        if self.state is not None:
            # Bounded: only counters grow; the keys kept never exceed their cap.
            stored = sum(isinstance(e, MessageAccepted | RunCompleted | PartialAnswerStored)
                         for e in self.events)
            assert self.state.message_count == stored
            assert len(self.state.idempotency) <= max(self.policy.max_idempotency_keys, 1)
            assert len(self.state.queued) <= self.policy.max_queued_messages, "queue over its cap"
            waiting = [m for m in self.enqueued if m not in self.started_from_queue]
            assert [q.message_id for q in self.state.queued] == waiting
            assert not self.state.queued or active is not None, "a queue with no run active"
        assert all(count <= 1 for count in self.terminals.values())
        self.healthy = True

    @invariant()
    def next_deadline_is_exact(self) -> None:
        """Invariant: a tick just before next_deadline_ms does nothing and one at it does something."""
        self.healthy = False
        deadline = self.deadline_fn(self.state, self.policy)
        if deadline is None:
            assert self.decide_fn(self.state, tick(self.now + 10**9), self.policy, Known()) == []
        else:
            early = self.decide_fn(self.state, tick(deadline - 1), self.policy, Known())
            assert early == [], "a tick before next_deadline_ms fired"
            due = self.decide_fn(self.state, tick(deadline), self.policy, Known())
            assert due != [], "a tick at next_deadline_ms did nothing"
        self.healthy = True

    def teardown(self) -> None:
        """The command log replays to the same events and state, and the clock alone ends every run."""
        if not self.healthy:
            return  # a step already failed; let its error be the one reported
        # Determinism: the command log replays to the same events and state.
        replayed: list[Event]
        state, replayed = initial_state(), []
        for command in self.commands:
            events = self.decide_fn(state, command, self.policy, known_for(replayed, command))
            replayed.extend(events)
            state = apply(state, events, self.policy)
        assert replayed == self.events, "replay decided other events"
        assert state == self.state, "replay reached another state"
        # Liveness: with every worker gone, the clock alone ends every run, queued ones too.
        for _ in range((2 * self.policy.max_attempts + 1) * (len(self.enqueued) + 1)):
            deadline = self.deadline_fn(self.state, self.policy)
            if deadline is None:
                break
            self.now = max(self.now, deadline)
            assert self.execute(tick(self.now)) != []
        assert self.deadline_fn(self.state, self.policy) is None
        assert self.open_runs == set(), "runs left open"
        assert all(self.terminals[run] == 1 for run in self.accepted_runs)
        # Every enqueued message ran exactly once, in the order it was queued.
        assert self.started_from_queue == self.enqueued, "a queued message never ran"


ThreadMachine.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_thread_machine = ThreadMachine.TestCase


# --- decide is total over arbitrary commands ------------------------------------------

ids = st.sampled_from(["m1", "m2", "", "\ud800"]) | st.text(max_size=5)
times = st.integers(-(10**6), 10**12)
run_ids = st.sampled_from([run_id_for(T, m) for m in ("m1", "m2")]) | st.text(max_size=3)
attempts = st.integers(-1, 4) | st.integers()
any_command: st.SearchStrategy[Any] = st.one_of(
    st.builds(CreateThread, st.just(T), st.sampled_from([TENANT, "x"]), st.text(), times),
    st.builds(
        PostUserMessage,
        st.just(T),
        st.sampled_from([TENANT, "x"]),
        ids,
        st.text(),
        st.none() | ids,
        times,
    ),
    st.builds(CancelRun, st.just(T), st.sampled_from([TENANT, "x"]), run_ids, st.text(), times),
    st.builds(ReportAttemptStarted, st.just(T), run_ids, attempts, st.text(), times),
    st.builds(ReportHeartbeat, st.just(T), run_ids, attempts, st.text(), times),
    st.builds(
        ReportAttemptCompleted,
        st.just(T),
        run_ids,
        attempts,
        st.text(),
        st.text(),
        st.just(STEPS),
        st.just(()),
        times,
    ),
    st.builds(
        ReportAttemptFailed,
        st.just(T),
        run_ids,
        attempts,
        st.text(),
        st.text(),
        st.booleans(),
        times,
    ),
    st.builds(CheckDeadlines, st.just(T), times),
)
any_policy = st.builds(
    Policy,
    max_attempts=st.integers(0, 5) | st.just(5_000),
    backoff_initial_ms=st.integers(0, 10**6),
    backoff_multiplier=st.floats(0.5, 10.0),
    max_input_chars=st.integers(0, 50),
)


@settings(max_examples=300, deadline=None)
@hypothesis.given(policy=any_policy, commands=st.lists(any_command, max_size=30))
def test_decide_never_raises_and_replays_identically(
    policy: Policy, commands: list[Command]
) -> None:
    """Any command sequence is decided without raising, twice alike, and only posts create messages."""
    def run() -> tuple[list[list[Event]], ThreadState | None]:
        state, decided = initial_state(), []
        for command in commands:
            events = decide(state, command, policy)
            decided.append(events)
            state = apply(state, events)
        return decided, state

    first, final = run()
    assert run() == (first, final)
    for command, events in zip(commands, first, strict=True):
        if isinstance(command, CreateThread):
            assert all(isinstance(event, ThreadCreated) for event in events)
        elif not isinstance(command, PostUserMessage):
            assert not any(
                isinstance(e, (ThreadCreated, MessageAccepted, RunRejected)) for e in events
            )


# --- the properties can fail ----------------------------------------------------------


def _ignores_conflicts(state: ThreadState | None, command: Command, policy: Policy,
                       known: Known) -> list[Event]:
    if isinstance(command, PostUserMessage) and state is not None:
        state = replace(state, active_run=None)
    return decide(state, command, policy, known)


def _one_attempt_too_many(
    state: ThreadState | None, command: Command, policy: Policy, known: Known
) -> list[Event]:
    return decide(state, command, replace(policy, max_attempts=policy.max_attempts + 1), known)


def _deadline_one_late(state: ThreadState | None, policy: Policy) -> int | None:
    deadline = next_deadline_ms(state, policy)
    return None if deadline is None else deadline + 1


def _never_times_out(state: ThreadState | None, command: Command, policy: Policy,
                     known: Known) -> list[Event]:
    return [] if isinstance(command, CheckDeadlines) else decide(state, command, policy, known)


def _no_deadline(state: ThreadState | None, policy: Policy) -> None:
    return None


def _drops_the_queue(state: ThreadState | None, command: Command, policy: Policy,
                     known: Known) -> list[Event]:
    events = decide(state, command, policy, known)
    return events if isinstance(command, PostUserMessage) else \
        decide(replace(state, queued=()) if state is not None else None, command, policy, known)


def _runs_the_queue_newest_first(state: ThreadState | None, command: Command, policy: Policy,
                                 known: Known) -> list[Event]:
    if state is not None and not isinstance(command, PostUserMessage):
        state = replace(state, queued=state.queued[::-1])
    return decide(state, command, policy, known)


_calls = itertools.count()


def _counts_calls(state: ThreadState | None, command: Command, policy: Policy,
                  known: Known) -> list[Event]:
    events = decide(state, command, policy, known)
    return [
        replace(e, detail=str(next(_calls))) if isinstance(e, RunRejected) else e for e in events
    ]


MUTANTS = {
    "two-active-runs": ({"decide_fn": staticmethod(_ignores_conflicts)}, "two active runs"),
    "attempt-cap": ({"decide_fn": staticmethod(_one_attempt_too_many)}, "beyond max_attempts"),
    "deadline-off-by-one": (
        {"deadline_fn": staticmethod(_deadline_one_late)},
        "a tick before next_deadline_ms fired",
    ),
    "runs-never-end": (
        {"decide_fn": staticmethod(_never_times_out), "deadline_fn": staticmethod(_no_deadline)},
        "runs left open",
    ),
    "nondeterministic": ({"decide_fn": staticmethod(_counts_calls)}, "replay decided other events"),
    "queue-dropped": ({"decide_fn": staticmethod(_drops_the_queue)},
                      "a queue with no run active|a queued message never ran"),
    "queue-reversed": ({"decide_fn": staticmethod(_runs_the_queue_newest_first)},
                       "queued messages ran out of order"),
}


def _double_text_script(machine: ThreadMachine) -> None:
    """A run, two messages queued behind it, then each active run completes: the
    steps a queue mutant needs, checked as the state machine checks them."""
    machine.start(POLICY)
    machine.post_message("m1", None, "hi", TENANT, MultitaskStrategy.REJECT, 10)
    machine.post_message("m2", None, "hello", TENANT, ENQUEUE, 10)
    machine.post_message("m3", None, "hi", TENANT, ENQUEUE, 10)
    machine.state_agrees_with_the_event_log()
    for _ in range(3):
        if machine.state is None or machine.state.active_run is None:
            break
        machine.worker_report("completed", False, 10)
        machine.state_agrees_with_the_event_log()
    machine.teardown()


@pytest.mark.parametrize(("mutant", "message"), [MUTANTS["queue-dropped"],
                                                 MUTANTS["queue-reversed"]],
                         ids=["queue-dropped", "queue-reversed"])
def test_the_invariants_catch_a_broken_queue_in_a_scripted_run(mutant: dict[str, Any],
                                                                message: str) -> None:
    """The queue mutants, caught on a fixed script whatever the session's seed (the
    search below may miss them: the global seed overrides its derandomize)."""
    broken = type("BrokenThreadMachine", (ThreadMachine,), mutant)
    with pytest.raises(AssertionError, match=message):
        _double_text_script(broken())
    _double_text_script(ThreadMachine())  # the real decider passes the same script


SEARCHED = {name: m for name, m in MUTANTS.items() if not name.startswith("queue-")}


@pytest.mark.parametrize(("mutant", "message"), SEARCHED.values(), ids=SEARCHED.keys())
def test_the_invariants_catch_a_broken_decider(mutant: dict[str, Any], message: str) -> None:
    """Each deliberately broken decider is caught by the state machine's checks (the
    queue mutants on a script above: a search needs two queued messages and missed
    them now and then under the session's random seed)."""
    broken = type("BrokenThreadMachine", (ThreadMachine,), mutant)
    quick = settings(
        max_examples=300,
        stateful_step_count=40,
        deadline=None,
        database=None,
        print_blob=False,
        phases=[Phase.generate],  # the failure itself is the point; skip shrinking it
        derandomize=True,  # the same examples every run: no flaky misses
    )
    with pytest.raises(AssertionError, match=message):
        run_state_machine_as_test(broken, settings=quick)
