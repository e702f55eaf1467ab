"""The step journal's pure rules: `streams.core.journal` and the decider's handling of
`ReportStepCompleted` (given events, when a command, then events), with properties
over random step reports and a seeded fault that proves the properties can fail."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest
from hypothesis import given as hgiven
from hypothesis import strategies as st

from streams.core.domain import (
    AttemptDispatched,
    AttemptStarted,
    CheckDeadlines,
    Command,
    Event,
    JournalLimits,
    Policy,
    ReportAttemptFailed,
    ReportAttemptStarted,
    ReportStepCompleted,
    RetryScheduled,
    RunFailed,
    StepRecorded,
    ThreadState,
)
from streams.core.journal import (
    MODEL_TURN,
    TOOL_CALL,
    JournalEntry,
    admit,
    entry_bytes,
    entry_from_json,
    entry_to_json,
    idempotency_key,
    merge,
)
from streams.core.lifecycle import dispatch_record
from streams.core.thread import apply, decide, initial_state
from tests.streams.test_thread import POLICY, RUN1, T, accepted, created, given

W = "worker-a"


def started_run() -> list[Event]:
    """Thread T with run 1's attempt 1 started."""
    return [created(), *accepted(), AttemptStarted(T, RUN1, 1, W, 1_000)]


def _entry(step: int, kind: str = TOOL_CALL, execution: str = "e1", size: int = 2) -> JournalEntry:
    return JournalEntry(step, kind, "lookup", "{}", "x" * size, execution)


def _report(step: int, attempt: int = 1, at: int = 2_000, **kw: object) -> ReportStepCompleted:
    return ReportStepCompleted(T, RUN1, attempt, W, _entry(step, **kw), at)  # type: ignore[arg-type]


def _recorded(step: int, attempt: int = 1, at: int = 2_000, **kw: object) -> StepRecorded:
    return StepRecorded(T, RUN1, attempt, _entry(step, **kw), at)  # type: ignore[arg-type]


# --- given / when / then -------------------------------------------------------------


def test_the_next_step_of_the_live_attempt_is_recorded_and_counts_as_a_heartbeat() -> None:
    """A step report of the current attempt with the next step number records the step."""
    state = given(started_run()).when(_report(0, at=5_000)).then([_recorded(0, at=5_000)])
    assert state is not None and state.active_run is not None
    assert state.active_run.journal == (_entry(0),)
    assert state.active_run.last_heartbeat_ms == 5_000


def test_a_repeated_or_gapped_step_decides_nothing() -> None:
    """A redelivered step, another execution's copy of a recorded step, or a gap decide nothing."""
    history = [*started_run(), _recorded(0)]
    given(history).when(_report(0)).then([])
    given(history).when(_report(0, execution="e2")).then([])
    given(history).when(_report(2)).then([])


def test_a_deposed_attempts_step_is_refused() -> None:
    """Steps of an attempt the run has moved past, or of a run that ended, decide nothing."""
    retried = [*started_run(), RetryScheduled(T, RUN1, 1, 2, 3_000, "failed: x", 1_500)]
    given(retried).when(_report(0)).then([])
    redispatched = [*retried, AttemptDispatched(T, RUN1, "m-1", 2, 3_000)]
    given(redispatched).when(_report(0, attempt=1)).then([])
    given(redispatched).when(_report(0, attempt=2)).then([_recorded(0, attempt=2)])
    ended = [*started_run(), RunFailed(T, RUN1, 1, "x", 1_500)]
    given(ended).when(_report(0)).then([])


def test_the_journal_outlives_the_attempt_and_rides_on_the_next_dispatch() -> None:
    """Steps recorded by attempt 1 stay in the run's journal and the retry's dispatch carries them."""
    history = [*started_run(), _recorded(0, kind=MODEL_TURN), _recorded(1),
               RetryScheduled(T, RUN1, 1, 2, 3_000, "heartbeat_timeout", 2_500)]
    dispatched = AttemptDispatched(T, RUN1, "m-1", 2, 3_000)
    state = given(history).when(_tick(3_000)).then([dispatched])
    assert state is not None and state.active_run is not None
    journal = state.active_run.journal
    assert [e.step for e in journal] == [0, 1]
    assert dispatch_record(dispatched, T, "hi", (), journal).journal == journal


def test_caps_end_the_run_with_a_clear_reason() -> None:
    """A step past the step, tool-call or byte caps ends the run run_failed, not a retry."""
    tight = replace(POLICY, journal=JournalLimits(max_steps=2, max_tool_calls=1,
                                                  max_entry_bytes=100, max_journal_bytes=150))
    one = [*started_run(), _recorded(0)]
    given(one, tight).when(_report(1)).then([_failed("too_many_tool_calls")])
    given(one, tight).when(_report(1, kind=MODEL_TURN, size=500)).then([_failed("step_too_large")])
    given(one, tight).when(_report(1, kind=MODEL_TURN, size=90)).then([_failed("step_too_large")])
    two = [*one, _recorded(1, kind=MODEL_TURN)]
    given(two, tight).when(_report(2, kind=MODEL_TURN)).then([_failed("too_many_steps")])


def _failed(reason: str) -> RunFailed:
    class _Starts(str):
        def __eq__(self, other: object) -> bool:
            return isinstance(other, str) and other.startswith(reason)

        __hash__ = str.__hash__

    return RunFailed(T, RUN1, 1, _Starts(reason), 2_000)


def _tick(now: int) -> CheckDeadlines:
    return CheckDeadlines(T, now)


# --- properties ------------------------------------------------------------------------

_REPORTS = st.lists(st.tuples(st.integers(0, 6), st.integers(1, 2), st.sampled_from(["e1", "e2"]),
                              st.booleans()), max_size=30)


def _fold(reports: Sequence[tuple[int, int, str, bool]],
          decider: Callable[..., list[Event]] = decide) -> tuple[ThreadState | None, list[Event]]:
    """Random step reports (and a retry half-way if asked) folded through `decider`."""
    state = apply(initial_state(), started_run(), POLICY)
    log: list[Event] = []
    for step, attempt, execution, fail_first in reports:
        commands: list[Command] = []
        if fail_first and state is not None and state.active_run is not None:
            run = state.active_run
            commands.append(ReportAttemptFailed(T, RUN1, run.attempt, W, "x", True, 100))
            commands.append(_tick(10**9))
            commands.append(_started(run.attempt + 1))
        commands.append(ReportStepCompleted(T, RUN1, attempt, W, _entry(step, execution=execution),
                                            200))
        for command in commands:
            events = decider(state, command, POLICY)
            log += events
            state = apply(state, events, POLICY)
    return state, log


def _started(attempt: int) -> ReportAttemptStarted:
    return ReportAttemptStarted(T, RUN1, attempt, W, 150)


def _journal_invariants(state: ThreadState | None, log: list[Event]) -> None:
    recorded = [e for e in log if isinstance(e, StepRecorded)]
    # Each step number recorded once per run, in order, by the attempt live at the time.
    assert [e.entry.step for e in recorded] == list(range(len(recorded)))
    if state is not None and state.active_run is not None:
        assert state.active_run.journal == tuple(e.entry for e in recorded)
    attempt = 1
    for event in log:
        if isinstance(event, AttemptDispatched):
            attempt = event.attempt
        if isinstance(event, StepRecorded):
            assert event.attempt == attempt


@hgiven(_REPORTS)
def test_each_step_is_recorded_once_in_order_by_the_live_attempt(
        reports: list[tuple[int, int, str, bool]]) -> None:
    """Over random reports, retries and racing executions, the journal holds each step
    number once, in order, each recorded by the attempt live at the time."""
    state, log = _fold(reports)
    _journal_invariants(state, log)


def _records_anything(state: ThreadState | None, command: Command, policy: Policy) -> list[Event]:
    """A broken decider: step reports skip the fence and the step-number check."""
    if isinstance(command, ReportStepCompleted):
        return [StepRecorded(T, RUN1, command.attempt, command.entry, command.now_ms)]
    return decide(state, command, policy)


def test_the_properties_catch_a_decider_that_records_anything() -> None:
    """The invariants fail for a decider without the fence: the property can fail."""
    with pytest.raises(AssertionError):
        _journal_invariants(*_fold([(0, 1, "e1", False), (0, 1, "e2", False)], _records_anything))
    with pytest.raises(AssertionError):
        _journal_invariants(*_fold([(0, 1, "e1", True), (1, 1, "e1", False)], _records_anything))


# --- streams.core.journal ---------------------------------------------------------------------

_ENTRIES = st.builds(JournalEntry, st.integers(0, 8), st.sampled_from([MODEL_TURN, TOOL_CALL]),
                     st.text(max_size=5), st.text(max_size=20), st.text(max_size=20),
                     st.text(max_size=4))


@hgiven(st.lists(_ENTRIES, max_size=12), st.lists(_ENTRIES, max_size=12))
def test_merge_keeps_the_first_of_each_step_without_gaps(
        first: list[JournalEntry], second: list[JournalEntry]) -> None:
    """merge keeps the first entry of each step number, numbered 0.. without a gap."""
    merged = merge(first, second)
    assert [e.step for e in merged] == list(range(len(merged)))
    for entry in merged:
        assert entry == next(e for e in [*first, *second] if e.step == entry.step)
    assert len(merged) not in {e.step for e in [*first, *second]}


@hgiven(_ENTRIES)
def test_an_entry_survives_its_lifecycle_detail(entry: JournalEntry) -> None:
    """An entry written into a step_recorded record's detail reads back the same."""
    assert entry_from_json(entry_to_json(entry)) == entry
    assert entry_from_json("not json") is None


@hgiven(st.lists(_ENTRIES, max_size=10), _ENTRIES, st.integers(1, 10), st.integers(1, 10),
        st.integers(1, 200), st.integers(1, 2_000))
def test_admit_refuses_exactly_past_the_caps(journal: list[JournalEntry], entry: JournalEntry,
                                             steps: int, calls: int, entry_max: int,
                                             total_max: int) -> None:
    """admit refuses exactly when a cap would be passed, and names the cap."""
    limits = JournalLimits(steps, calls, entry_max, total_max)
    reason = admit(tuple(journal), entry, limits)
    over = {"too_many_steps": len(journal) >= steps,
            "too_many_tool_calls": entry.kind == TOOL_CALL
            and sum(e.kind == TOOL_CALL for e in journal) >= calls,
            "step_too_large": entry_bytes(entry) > entry_max
            or entry_bytes(entry) + sum(entry_bytes(e) for e in journal) > total_max}
    assert (reason is None) == (not any(over.values()))
    if reason is not None:
        assert over[reason.split(":")[0]]


def test_idempotency_keys_name_run_and_step() -> None:
    """A step's idempotency key is run_id:step, the same in every attempt."""
    assert idempotency_key("r-1", 4) == "r-1:4"


def test_attempt_started_is_needed_for_nothing() -> None:
    """A step of a dispatched, not yet started attempt is recorded too (reports keep order)."""
    history = [e for e in started_run() if not isinstance(e, AttemptStarted)]
    given(history).when(_report(0)).then([_recorded(0)])
