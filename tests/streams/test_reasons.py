"""The typed vocabulary is the wire's: each member's value is the string events have
always carried, and a member reads back from its plain string."""

from __future__ import annotations

import pytest

from streams.core.domain import Command, WorkerReport
from streams.core.reasons import CancelReason, FailureCode

# Fixed forever: events on the topics carry these strings.
WIRE = {
    CancelReason.INTERRUPTED: "interrupted",
    CancelReason.ROLLED_BACK: "rolled_back",
    CancelReason.THREAD_DELETED: "thread deleted",
    FailureCode.HEARTBEAT_TIMEOUT: "heartbeat_timeout",
    FailureCode.ATTEMPT_TIMEOUT: "attempt_timeout",
    FailureCode.INTERRUPT_TIMEOUT: "interrupt_timeout",
    FailureCode.OUTPUT_TOO_LARGE: "output_too_large",
    FailureCode.RECORD_TOO_LARGE: "record_too_large",
    FailureCode.TOO_MANY_STEPS: "too_many_steps",
    FailureCode.TOO_MANY_TOOL_CALLS: "too_many_tool_calls",
    FailureCode.STEP_TOO_LARGE: "step_too_large",
}


def test_every_member_is_pinned() -> None:
    """No member is added or renamed without pinning its wire string here."""
    assert set(WIRE) == {*CancelReason, *FailureCode}


@pytest.mark.parametrize(("member", "wire"), list(WIRE.items()))
def test_a_member_is_its_wire_string(member: CancelReason | FailureCode, wire: str) -> None:
    """Equal to, formatted as and hashed as its string, and read back from it."""
    assert (member == wire, f"{member}", str(member), hash(member) == hash(wire)) == (True, wire, wire, True)
    assert type(member)(wire) is member


def test_the_worker_reports_are_commands() -> None:
    """WorkerReport is the one union of a worker's reports, and part of Command."""
    reports = set(WorkerReport.__args__)
    assert {t.__name__ for t in reports} == {
        "ReportAttemptStarted", "ReportHeartbeat", "ReportAttemptCompleted", "ReportAttemptFailed",
        "ReportStepCompleted", "ReportExecutionStarted"}
    assert reports < set(Command.__args__)
