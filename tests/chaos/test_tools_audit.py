"""The tool audit on its own: a completed call made again is a violation, a call
repeated before its record is the documented window, and the counts add up."""

from __future__ import annotations

from chaos.tools_audit import audit_tools
from streams.core.domain import StepRecorded
from streams.core.journal import MODEL_TURN, TOOL_CALL, JournalEntry


def _recorded(run: str, step: int, at: int, kind: str = TOOL_CALL) -> StepRecorded:
    return StepRecorded("t", run, 1, JournalEntry(step, kind, "lookup", "{}", "{}", "e"), at)


def test_each_completed_call_made_once_passes() -> None:
    """Calls made once, and one repeated before its record (the window), pass."""
    lines = ["start r:1 10 100", "done r:1 10 150", "start r:3 10 300",  # killed inside r:3
             "start r:3 11 900", "done r:3 11 950"]
    events = [_recorded("r", 0, 50, MODEL_TURN), _recorded("r", 1, 160), _recorded("r", 3, 960)]
    found = audit_tools(lines, events)
    assert found.violations == []
    assert (found.executions, found.completed, found.repeated_in_window, found.duplicates) == \
        (3, 2, 1, 0)


def test_a_completed_call_made_again_is_a_violation() -> None:
    """A start of a key after its StepRecorded is a duplicate of a completed call."""
    lines = ["start r:1 10 100", "done r:1 10 150", "start r:1 11 400", "done r:1 11 450"]
    found = audit_tools(lines, [_recorded("r", 1, 160)])
    assert found.duplicates == 1
    assert any("made again" in v for v in found.violations)


def test_the_decision_time_is_when_a_call_counts_as_completed() -> None:
    """A call started again after the report but before the processor decided it is the
    window; after the decision it is a duplicate."""
    lines = ["start r:1 10 100", "done r:1 10 150", "start r:1 11 400", "done r:1 11 450"]
    assert audit_tools(lines, [_recorded("r", 1, 160)], {"r:1": 500}).duplicates == 0
    assert audit_tools(lines, [_recorded("r", 1, 160)], {"r:1": 300}).duplicates == 1


def test_a_record_without_a_call_or_recorded_twice_or_a_bad_line() -> None:
    """A recorded call never made, one recorded twice, and an unreadable line are violations."""
    found = audit_tools(["nonsense"], [_recorded("r", 1, 1), _recorded("r", 1, 2)])
    assert len(found.violations) == 3


def test_the_mcp_servers_dedup_is_a_call_made_and_cancelled_is_not() -> None:
    """The MCP server's log: `dedup` (a key done before, answered again) counts as a call
    made, a window repeat before the record and a duplicate after it; `cancelled` is not
    a call."""
    lines = ["start r:1 10 100", "done r:1 10 150", "dedup r:1 11 155",
             "start r:3 11 300", "cancelled r:3 11 310", "start r:3 12 400", "done r:3 12 450"]
    found = audit_tools(lines, [_recorded("r", 1, 160), _recorded("r", 3, 460)])
    assert found.violations == []
    assert (found.executions, found.repeated_in_window, found.duplicates) == (4, 2, 0)
    late = audit_tools([*lines, "dedup r:1 13 900"], [_recorded("r", 1, 160), _recorded("r", 3, 460)])
    assert late.duplicates == 1
