"""The tool audit: no completed tool call is ever made again.

Messages marked `[tools=2]` make the builtin agent call a tool twice: the MCP
server's `lookup` (streams/testing/mcp_server.py), or with `[lookup]` its own;
each call appends `start <run_id>:<step> <pid> <ms>` and, when it returns,
`done <run_id>:<step> <pid> <ms>` to the run's tool log (the MCP server also logs
`cancelled`, ignored here, and `dedup` for a key it had done before, counted as a
call made: it reached the server). A call is **completed**
once the processor decided its `StepRecorded` (the event's envelope time, when
the processor produced it; its transaction commits a little later, so the check
errs on the strict side; without that time, the event's `at_ms`, the worker's
clock when it reported). After that every execution must replay it: a `start` of
the same key after the decision is a **duplicate of a completed call**, the one
thing the step journal promises never happens. A key started again before its
decision is the documented window (a call that started, or even finished and was
reported, but was not yet recorded when another execution took over); those are
counted, not failed.

Pure: it reads the log's lines and the events, and returns the counts and the
violations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streams.core.domain import Event, StepRecorded
from streams.core.journal import TOOL_CALL

__all__ = ["ToolFindings", "audit_tools"]


@dataclass(slots=True)
class ToolFindings:
    """What the tool log and the events say."""

    executions: int = 0  # `start` lines: every time a tool function was entered
    completed: int = 0  # tool calls recorded in a journal
    repeated_in_window: int = 0  # calls entered again before their record (allowed)
    duplicates: int = 0  # calls entered again after their record (violations)
    violations: list[str] = field(default_factory=list)


def audit_tools(lines: Iterable[str], events: Iterable[Event],
                decided_ms: Mapping[str, int] | None = None) -> ToolFindings:
    """Check the tool log against the recorded tool calls (`decided_ms`: when each
    `run_id:step` was decided, see the module's docstring)."""
    findings = ToolFindings()
    starts: dict[str, list[float]] = defaultdict(list)
    for line in lines:
        parts = line.split()
        if len(parts) != 4 or parts[0] not in ("start", "done", "cancelled", "dedup"):
            findings.violations.append(f"unreadable tool log line {line!r}")
            continue
        if parts[0] in ("start", "dedup"):
            findings.executions += 1
            starts[parts[1]].append(float(parts[3]))
    recorded: dict[str, int] = {}
    for event in events:
        if isinstance(event, StepRecorded) and event.entry.kind == TOOL_CALL:
            key = f"{event.run_id}:{event.entry.step}"
            if key in recorded:
                findings.violations.append(f"tool call {key} recorded twice")
            recorded.setdefault(key, (decided_ms or {}).get(key, event.at_ms))
    findings.completed = len(recorded)
    for key, times in starts.items():
        at = recorded.get(key)
        later = [t for t in times if at is not None and t > at]
        findings.duplicates += len(later)
        findings.repeated_in_window += len(times) - 1 - len(later) if len(times) > 1 else 0
        if later:
            findings.violations.append(f"completed tool call {key} (recorded at {at}) was made "
                                       f"again {len(later)} time(s) after it")
    for key in recorded.keys() - starts.keys():
        findings.violations.append(f"tool call {key} recorded but never made")
    return findings
