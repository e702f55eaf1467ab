"""The lifecycle names, records and the fold of a run's fate, without Kafka."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.core.domain import (
    ActiveRun,
    AssistantMessage,
    AttemptDispatched,
    MessageAccepted,
    RetryScheduled,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunStatus,
    ThreadState,
)
from streams.core.ids import answer_message_id_for, run_id_for, workflow_id_for
from streams.core.lifecycle import (
    TERMINAL,
    Lifecycle,
    RunFate,
    StreamEnd,
    dispatch_record,
    lifecycle_record,
)
from streams.core.records import Dispatch, HistoryMessage, RunLifecycle

T = "t-1"
RUN = run_id_for(T, "m-1")
RUN_STATE = ActiveRun(RUN, "m-1", 2, RunStatus.RUNNING, 0, 0, None)
BEFORE = ThreadState(T, "acme", "title", 0, active_run=RUN_STATE)


def test_names_are_the_wire_strings() -> None:
    """Shows the lifecycle and stream-end names are the exact strings on the wire, and which are terminal."""
    assert [n.value for n in Lifecycle] == [
        "run_accepted", "attempt_dispatched", "retry_scheduled", "run_completed", "run_failed",
        "run_cancelled", "step_recorded", "interrupt", "execution_started"]
    assert (StreamEnd.DONE, StreamEnd.MESSAGE_NOT_STREAMING) == ("done", "message_not_streaming")
    assert {"run_completed", "run_failed", "run_cancelled"} == TERMINAL
    assert f"{Lifecycle.RUN_ACCEPTED}" == "run_accepted"


def test_fate_kills_attempts_the_lifecycle_says_are_over() -> None:
    """Shows a run's fate kills attempts once a later one is dispatched, a retry is scheduled, or it ends."""
    fate = RunFate()
    assert not fate.learn("run_accepted", 0)
    fate.learn("attempt_dispatched", 1)
    assert not fate.kills(1)
    fate.learn("retry_scheduled", 1)
    assert fate.kills(1) and not fate.kills(2)
    fate.learn("attempt_dispatched", 3)
    assert fate.kills(2) and not fate.kills(3)
    fate.learn("run_cancelled", 0)  # cancellations carry attempt 0
    assert fate.kills(3) and fate.kills(9)


_RECORDS = st.lists(st.tuples(st.sampled_from([*Lifecycle]), st.integers(0, 20)), max_size=12)


@given(_RECORDS, st.randoms())
def test_fate_is_the_same_in_any_order(records: list[tuple[Lifecycle, int]], rnd: object) -> None:
    """Shows a run's fate comes out the same whatever order its lifecycle records are learnt in."""
    forward, shuffled = RunFate(), RunFate()
    for event, attempt in records:
        forward.learn(event, attempt)
    again = list(records)
    rnd.shuffle(again)  # type: ignore[attr-defined]
    for event, attempt in again:
        shuffled.learn(event, attempt)
    assert forward == shuffled


@given(_RECORDS, st.integers(1, 25))
def test_fate_kills_exactly_the_attempts_past(records: list[tuple[Lifecycle, int]],
                                              attempt: int) -> None:
    """Shows the fate kills an attempt exactly when the run ended or a later attempt or retry is past it."""
    fate = RunFate()
    for event, a in records:
        fate.learn(event, a)
    ended = any(e in TERMINAL for e, _ in records)
    past = any((e == Lifecycle.ATTEMPT_DISPATCHED and a > attempt)
               or (e == Lifecycle.RETRY_SCHEDULED and a >= attempt) for e, a in records)
    assert fate.kills(attempt) == (ended or past)


def test_lifecycle_records_mirror_the_run_decisions() -> None:
    """Shows run decisions become stream-topic lifecycle records of the answer message, attempt and detail."""
    accepted = lifecycle_record(RunAccepted(T, RUN, workflow_id_for(T), "m-1", 5), BEFORE)
    assert accepted is not None
    assert (accepted.run_id, accepted.attempt, accepted.part_id, accepted.seq) == \
        (RUN, 0, "lifecycle", 0)
    assert accepted.message_id == answer_message_id_for(RUN)
    assert accepted.payload == RunLifecycle("run_accepted", "m-1", "")
    retry = lifecycle_record(RetryScheduled(T, RUN, 2, 3, 9, "heartbeat_timeout", 5), BEFORE)
    assert retry is not None and retry.attempt == 2
    assert retry.payload == RunLifecycle("retry_scheduled", "m-1", "heartbeat_timeout")
    cancelled = lifecycle_record(RunCancelled(T, RUN, "by user", 5), BEFORE)
    assert cancelled is not None and cancelled.attempt == 2  # the attempt that was running
    answer = AssistantMessage(answer_message_id_for(RUN), "hi", (), ())
    completed = lifecycle_record(RunCompleted(T, RUN, 2, answer, 5), BEFORE)
    assert completed is not None and completed.payload == \
        RunLifecycle("run_completed", "m-1", "", answer, BEFORE.message_count)
    assert type(completed.payload.event) is str


def test_no_lifecycle_record_for_other_events_or_without_a_state() -> None:
    """Shows other events, and events without a thread state, give no lifecycle record."""
    assert lifecycle_record(MessageAccepted(T, "m-1", "hi", None, 5), BEFORE) is None
    assert lifecycle_record(AttemptDispatched(T, RUN, "m-1", 1, 5), None) is None


def test_dispatch_record() -> None:
    """Shows an attempt's dispatch carries its run, message, attempt, workflow, input, history and time."""
    history = (HistoryMessage("m-0", "user", "earlier"),)
    assert dispatch_record(AttemptDispatched(T, RUN, "m-1", 2, 7), T, "hi", history) == \
        Dispatch(RUN, "m-1", 2, workflow_id_for(T), "hi", history, 7)
