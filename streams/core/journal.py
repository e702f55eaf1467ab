"""A run's step journal: the pure rules.

A step is one completed unit of an agent's work: a model turn's output (its text
and the tool calls it asked for) or a tool call with its result. Each is recorded
durably, fenced by run and attempt, before the next one starts; a later execution
of the same run replays the journal instead of doing the work again.

Pure: no I/O. `admit` says whether an entry may be appended (the caps and size
bounds); `merge` joins what a dispatch carried with what the stream showed since;
`idempotency_key` names a step for the outside world. The worker's runtime
(`streams.agents.runtime`) and the processor's decider both obey these rules.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from streams.core.reasons import FailureCode

__all__ = [
    "INTERRUPT",
    "MODEL_TURN",
    "TOOL_CALL",
    "JournalEntry",
    "JournalLimits",
    "admit",
    "entry_bytes",
    "entry_from_json",
    "entry_to_json",
    "idempotency_key",
    "merge",
]

MODEL_TURN = "model_turn"
TOOL_CALL = "tool_call"
INTERRUPT = "interrupt"


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One completed step of a run.

    `step` numbers the run's steps from 0; `kind` is `model_turn`, `tool_call` or
    `interrupt`; `input_json` is what went in (a tool's arguments, an interrupt's
    payload), `output_json` what came out (the turn, the tool's result, the resume
    value); `execution_id` is the execution that recorded it."""

    step: int
    kind: str
    name: str
    input_json: str
    output_json: str
    execution_id: str


@dataclass(frozen=True, slots=True)
class JournalLimits:
    """Per-run caps (Settings: THREADLINE_MAX_STEPS, THREADLINE_MAX_TOOL_CALLS,
    THREADLINE_MAX_STEP_BYTES, THREADLINE_MAX_JOURNAL_BYTES)."""

    max_steps: int = 64
    max_tool_calls: int = 32
    max_entry_bytes: int = 32 * 1024  # one entry's input and output, UTF-8
    max_journal_bytes: int = 256 * 1024  # all of a run's entries


def idempotency_key(run_id: str, step: int) -> str:
    """The stable key of a run's step: the same in every attempt that reaches it."""
    return f"{run_id}:{step}"


def entry_bytes(entry: JournalEntry) -> int:
    """What an entry costs against the byte caps: its strings, UTF-8."""
    return sum(len(s.encode("utf-8", "surrogatepass"))
               for s in (entry.kind, entry.name, entry.input_json, entry.output_json))


def admit(journal: tuple[JournalEntry, ...], entry: JournalEntry,
          limits: JournalLimits) -> str | None:
    """Why `entry` may not follow `journal`, or None if it may.

    The reason starts with `too_many_steps`, `too_many_tool_calls` or
    `step_too_large`; a caller that must end the run puts it in `RunFailed.error`."""
    if len(journal) >= limits.max_steps:
        return f"{FailureCode.TOO_MANY_STEPS}: the run reached its cap of {limits.max_steps} steps"
    if entry.kind == TOOL_CALL and \
            sum(e.kind == TOOL_CALL for e in journal) >= limits.max_tool_calls:
        return (f"{FailureCode.TOO_MANY_TOOL_CALLS}: the run reached its cap of "
                f"{limits.max_tool_calls} tool calls")
    size = entry_bytes(entry)
    if size > limits.max_entry_bytes:
        return (f"{FailureCode.STEP_TOO_LARGE}: a {entry.kind} step of {size} bytes, the limit is "
                f"{limits.max_entry_bytes}")
    total = size + sum(entry_bytes(e) for e in journal)
    if total > limits.max_journal_bytes:
        return (f"{FailureCode.STEP_TOO_LARGE}: the journal would hold {total} bytes, the limit is "
                f"{limits.max_journal_bytes}")
    return None


def merge(*sources: Iterable[JournalEntry]) -> tuple[JournalEntry, ...]:
    """The journal known from `sources` (a dispatch's, then the steps seen recorded
    since): the first entry of each step number, as far as the numbers run on
    without a gap."""
    by_step: dict[int, JournalEntry] = {}
    for source in sources:
        for entry in source:
            by_step.setdefault(entry.step, entry)
    journal: list[JournalEntry] = []
    while len(journal) in by_step:
        journal.append(by_step[len(journal)])
    return tuple(journal)


def entry_to_json(entry: JournalEntry) -> str:
    """The entry as the `detail` of its `step_recorded` lifecycle record."""
    return json.dumps(asdict(entry), ensure_ascii=False, sort_keys=True)


def entry_from_json(raw: str) -> JournalEntry | None:
    """An entry read back from a `step_recorded` record's detail; None if unreadable."""
    try:
        body = json.loads(raw)
        return JournalEntry(int(body["step"]), str(body["kind"]), str(body["name"]),
                            str(body["input_json"]), str(body["output_json"]),
                            str(body["execution_id"]))
    except (ValueError, KeyError, TypeError):
        return None
