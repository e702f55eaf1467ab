"""Human in the loop, the pure rules (`streams.core.interrupts` through `decide`): given
events, when a command, then events; and the agent side (`interrupt()`) on its own."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from streams.agents import AgentError, TextChunk
from streams.agents.builtin import BuiltinAgent
from streams.agents.runtime import InterruptRequested, RunContext, call_tool, drive, interrupt
from streams.agents.tools import Tool, ToolContext
from streams.core.domain import (
    AttemptDispatched,
    AttemptStarted,
    CancelRun,
    CheckDeadlines,
    JournalLimits,
    PostUserMessage,
    RejectReason,
    ReportHeartbeat,
    ReportStepCompleted,
    ResumeRun,
    RunCancelled,
    RunFailed,
    RunInterrupted,
    RunRejected,
    RunStatus,
    StepRecorded,
)
from streams.core.interrupts import RESUMED_BY
from streams.core.journal import INTERRUPT, TOOL_CALL, JournalEntry
from streams.core.lifecycle import dispatch_record, lifecycle_record
from streams.core.reasons import FailureCode
from streams.core.thread import apply, decide, initial_state, next_deadline_ms
from tests.streams.test_thread import POLICY, RUN1, TENANT, T, accepted, created, given

W = "worker-a"
TOOL = JournalEntry(0, TOOL_CALL, "lookup", "{}", '{"content": 1}', "e1")
ASK = JournalEntry(1, INTERRUPT, INTERRUPT, '{"question": "ok?"}', "", "e1")
RUNNING = [created(), *accepted(), AttemptStarted(T, RUN1, 1, W, 1_000),
           StepRecorded(T, RUN1, 1, TOOL, 1_500)]
INTERRUPTED = [*RUNNING, RunInterrupted(T, RUN1, 1, 1, ASK.input_json, 2_000)]


def test_an_interrupt_moves_the_run_to_interrupted_with_its_payload() -> None:
    """The live attempt's interrupt step: RunInterrupted, the payload kept, no deadline."""
    state = given(RUNNING).when(ReportStepCompleted(T, RUN1, 1, W, ASK, 2_000)).then(
        [RunInterrupted(T, RUN1, 1, 1, '{"question": "ok?"}', 2_000)])
    assert state is not None and state.active_run is not None
    assert state.active_run.awaiting_resume and state.active_run.shown_status == "interrupted"
    assert state.active_run.status is RunStatus.RETRY_WAIT and state.active_run.retry_due_ms is None
    assert state.active_run.interrupt_json == '{"question": "ok?"}'
    assert next_deadline_ms(state, POLICY) is None  # waits forever: no heartbeats needed
    given(INTERRUPTED).when(CheckDeadlines(T, 10**12)).then([])
    given(INTERRUPTED).when(ReportHeartbeat(T, RUN1, 1, W, 3_000)).then([])
    record = lifecycle_record(INTERRUPTED[-1], apply(initial_state(), RUNNING, POLICY))
    assert record is not None and record.payload.event == "interrupt"  # type: ignore[union-attr]


def test_resume_records_the_value_and_dispatches_the_attempt_again() -> None:
    """ResumeRun: the interrupt joins the journal with the value; the same attempt is dispatched."""
    resumed = JournalEntry(1, INTERRUPT, INTERRUPT, ASK.input_json, '"yes"', RESUMED_BY)
    state = given(INTERRUPTED).when(ResumeRun(T, TENANT, RUN1, '"yes"', 5_000)).then(
        [StepRecorded(T, RUN1, 1, resumed, 5_000), AttemptDispatched(T, RUN1, "m-1", 1, 5_000)])
    assert state is not None and state.active_run is not None
    assert state.active_run.status is RunStatus.DISPATCHED
    assert state.active_run.interrupt_json is None and not state.active_run.awaiting_resume
    assert state.active_run.journal == (TOOL, resumed)
    dispatch = dispatch_record(AttemptDispatched(T, RUN1, "m-1", 1, 5_000), T, "hi", (),
                               state.active_run.journal)
    assert dispatch.journal[-1].output_json == '"yes"'


def test_resume_of_a_run_not_interrupted_or_of_another_tenant_decides_nothing() -> None:
    """A resume of a running run, another run, another tenant, or a resumed run: nothing."""
    given(RUNNING).when(ResumeRun(T, TENANT, RUN1, "1", 5_000)).then([])
    given(INTERRUPTED).when(ResumeRun(T, "other", RUN1, "1", 5_000)).then([])
    given(INTERRUPTED).when(ResumeRun(T, TENANT, "run-x", "1", 5_000)).then([])
    resumed = [*INTERRUPTED, StepRecorded(T, RUN1, 1, replace(ASK, output_json="1"), 5_000),
               AttemptDispatched(T, RUN1, "m-1", 1, 5_000)]
    given(resumed).when(ResumeRun(T, TENANT, RUN1, "2", 6_000)).then([])


def test_an_interrupted_run_is_active_and_cancellable() -> None:
    """While interrupted the run is the thread's active run: a post conflicts, a cancel ends it."""
    given(INTERRUPTED).when(PostUserMessage(T, TENANT, "m-2", "hi", None, 3_000)).then(
        [RunRejected(T, "m-2", RejectReason.CONFLICT, "another run is active on the thread",
                     RUN1, 3_000)])
    given(INTERRUPTED).when(CancelRun(T, TENANT, RUN1, "no", 3_000)).then(
        [RunCancelled(T, RUN1, "no", 3_000)])


def test_the_optional_wait_timeout_fails_the_run() -> None:
    """With interrupt_timeout_ms set, a run that waits past it ends run_failed interrupt_timeout."""
    policy = replace(POLICY, interrupt_timeout_ms=10_000)
    state = apply(initial_state(), INTERRUPTED, policy)
    assert next_deadline_ms(state, policy) == 12_001
    given(INTERRUPTED, policy).when(CheckDeadlines(T, 12_000)).then([])
    given(INTERRUPTED, policy).when(CheckDeadlines(T, 12_001)).then(
        [RunFailed(T, RUN1, 1, FailureCode.INTERRUPT_TIMEOUT, 12_001)])


def test_an_interrupt_of_a_deposed_attempt_or_past_the_caps() -> None:
    """A stale attempt's interrupt decides nothing; one past the step cap ends the run."""
    given(RUNNING).when(ReportStepCompleted(T, RUN1, 2, W, ASK, 2_000)).then([])
    tight = replace(POLICY, journal=JournalLimits(max_steps=1))
    state = apply(initial_state(), RUNNING, tight)
    decided = decide(state, ReportStepCompleted(T, RUN1, 1, W, ASK, 2_000), tight)
    assert len(decided) == 1 and isinstance(decided[0], RunFailed)
    assert decided[0].error.startswith("too_many_steps")


# --- the agent side ------------------------------------------------------------------


async def test_interrupt_asks_then_returns_the_resume_value_on_replay() -> None:
    """interrupt() raises InterruptRequested the first time and returns the value once the
    journal holds the resumed interrupt; the builtin [approve] answer uses it."""
    agent = BuiltinAgent(tokens_per_s=0, words=2, tools=1)
    first = RunContext(run_id="r")
    with pytest.raises(InterruptRequested) as asked:
        [o async for o in drive(agent, (), "go [approve]", first)]
    assert asked.value.step == 2 and "May I answer" in asked.value.payload_json
    resumed = JournalEntry(2, INTERRUPT, INTERRUPT, asked.value.payload_json, '"ship it"',
                           RESUMED_BY)
    again = RunContext(run_id="r", journal=[*first.journal, resumed])
    outputs = [o async for o in drive(agent, (), "go [approve]", again)]
    text = "".join(getattr(o, "text", "") for o in outputs)
    assert text.endswith("Approved: ship it.")
    with pytest.raises(AgentError, match="journal mismatch"):  # an interrupt where a call was
        [o async for o in drive(agent, (), "go [approve]", RunContext(journal=[resumed]))]


async def test_a_tool_may_ask_a_human_and_runs_again_on_resume() -> None:
    """interrupt() inside a tool: the interrupt takes the tool's step; on resume the tool
    runs again with the same idempotency key, gets the value, and its result follows."""
    keys: list[str] = []

    async def refund(arguments: Mapping[str, Any], context: ToolContext) -> dict[str, Any]:
        keys.append(context.idempotency_key)
        answer = await interrupt({"refund": arguments["amount"]})
        return {"refunded": answer == "yes"}

    tool = Tool("refund", "", {"type": "object"}, refund)

    class Agent:
        async def run(self, history: object, message: str) -> Any:
            result = await call_tool(tool, {"amount": 40})
            yield TextChunk(f"done: {result.content}")

        async def aclose(self) -> None:
            return None

    first = RunContext(run_id="r")
    with pytest.raises(InterruptRequested) as asked:
        [o async for o in drive(Agent(), (), "x", first)]
    assert asked.value.step == 0
    resumed = JournalEntry(0, INTERRUPT, INTERRUPT, asked.value.payload_json, '"yes"', RESUMED_BY)
    again = RunContext(run_id="r", journal=[resumed])
    outputs = [o async for o in drive(Agent(), (), "x", again)]
    assert "".join(getattr(o, "text", "") for o in outputs) == "done: {'refunded': True}"
    assert keys == ["r:0", "r:0"]
    assert [e.kind for e in again.journal] == [INTERRUPT, TOOL_CALL]


async def test_the_builtin_confirm_tool_asks_from_inside_the_tool() -> None:
    """[confirm]: the `confirm` tool's call is emitted, then its interrupt takes that
    call's step; resumed, the tool runs again, its result holds the value, and the reply
    ends with it as JSON."""
    agent = BuiltinAgent(tokens_per_s=0, words=2, tools=1)
    first = RunContext(run_id="r")
    emitted: list[Any] = []
    with pytest.raises(InterruptRequested) as asked:
        async for output in drive(agent, (), "deploy it [confirm]", first):
            emitted.append(output)
    steps = [o.step for o in emitted if hasattr(o, "step")]
    assert [(s.kind, s.name) for s in steps][-1] == ("tool_call", "confirm")
    assert asked.value.step == 2  # after the lookup turn and call: the confirm call's step
    assert json.loads(asked.value.payload_json) == {"question": "May I deploy it?",
                                                    "tool": "confirm"}
    value = '{"approved": true, "reason": null}'
    resumed = JournalEntry(2, INTERRUPT, INTERRUPT, asked.value.payload_json, value, RESUMED_BY)
    again = RunContext(run_id="r", journal=[*first.journal, resumed])
    outputs = [o async for o in drive(agent, (), "deploy it [confirm]", again)]
    text = "".join(getattr(o, "text", "") for o in outputs)
    assert text.endswith('Confirmed: {"approved": true, "reason": null}.')
    results = [o.step for o in outputs if hasattr(o, "step") and o.step.kind == "tool_result"]
    assert json.loads(results[-1].payload_json)["content"] == {
        "action": "deploy it", "answer": {"approved": True, "reason": None}}
    assert [e.kind for e in again.journal][-2:] == [INTERRUPT, TOOL_CALL]
