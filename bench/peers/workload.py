"""The peers' workload, pure: the side-effect log every system's tool writes, read
back into steps, step overheads, repeated calls and progress after a kill.

Every system's tool appends two lines per call (one `write` each, O_APPEND):

    begin <run>:<step> <pid> <ms>     before the call's work (Threadline's builtin
                                      `lookup` writes `start`, read as `begin`)
    done <run>:<step> <pid> <ms>      after it

`<ms>` is wall-clock milliseconds since the epoch (a fraction allowed). A call is
*completed* once its `done` line is written; a completed call whose `begin`
appears again later was *repeated*: the side effect a durable runtime promises
never to make twice.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Call", "Line", "calls_by_run", "moving_again", "parse", "percentile",
           "repeated_calls", "runs_of", "step_overheads_ms"]

STEPS = 4  # tool calls per run
SHARED_LOG_ENV = "PEERS_TOOL_LOG"  # where the peers' own tools append their lines


@dataclass(frozen=True, slots=True)
class Line:
    """One line of the side-effect log."""

    what: str  # "begin" or "done"
    run: str
    step: str
    ms: float
    pid: str = ""  # the process that wrote it


@dataclass(slots=True)
class Call:
    """Every line of one tool call (`run:step`), in log order."""

    run: str
    step: str
    begins: list[float] = field(default_factory=list)
    dones: list[float] = field(default_factory=list)
    begun_by: list[str] = field(default_factory=list)  # the pid of each `begin`, in step

    @property
    def first_begin(self) -> float:
        """When the call first began."""
        return min(self.begins) if self.begins else min(self.dones)

    @property
    def first_done(self) -> float | None:
        """When the call first completed, or None."""
        return min(self.dones) if self.dones else None


def parse(text: str) -> list[Line]:
    """The log's lines; a torn or foreign line is skipped."""
    out: list[Line] = []
    for raw in text.splitlines():
        parts = raw.split()
        if len(parts) < 4 or parts[0] not in ("begin", "start", "done") or ":" not in parts[1]:
            continue
        run, _, step = parts[1].rpartition(":")
        try:
            ms = float(parts[3])
        except ValueError:
            continue
        out.append(Line("done" if parts[0] == "done" else "begin", run, step, ms, parts[2]))
    return out


def calls_by_run(lines: Iterable[Line], runs: Iterable[str] | None = None) \
        -> dict[str, list[Call]]:
    """Each run's calls ordered by when they first began (only `runs`, if given)."""
    wanted = None if runs is None else set(runs)
    calls: dict[tuple[str, str], Call] = {}
    for line in lines:
        if wanted is not None and line.run not in wanted:
            continue
        call = calls.setdefault((line.run, line.step), Call(line.run, line.step))
        if line.what == "begin":
            call.begins.append(line.ms)
            call.begun_by.append(line.pid)
        else:
            call.dones.append(line.ms)
    out: dict[str, list[Call]] = {}
    for call in calls.values():
        out.setdefault(call.run, []).append(call)
    for run_calls in out.values():
        run_calls.sort(key=lambda c: c.first_begin)
    return out


def step_overheads_ms(runs: Mapping[str, list[Call]]) -> list[float]:
    """From each call's first `done` to the next call's first `begin`, every run."""
    out: list[float] = []
    for run_calls in runs.values():
        for before, after in itertools.pairwise(run_calls):
            done = before.first_done
            if done is not None:
                out.append(after.first_begin - done)
    return out


def repeated_calls(runs: Mapping[str, list[Call]], kill_ms: float = float("inf")) \
        -> tuple[int, int, int]:
    """(completed calls begun again after their `done`, written before `kill_ms`;
    the same with the `done` written after the kill, when the dead role could not
    record it; calls begun again that had not completed: a call cut off mid-way,
    the window every runtime has)."""
    repeated = late = restarted = 0
    for run_calls in runs.values():
        for call in run_calls:
            done = call.first_done
            if done is not None and any(b > done for b in call.begins):
                if done < kill_ms:
                    repeated += 1
                else:
                    late += 1
            elif len(call.begins) > 1:
                restarted += 1
    return repeated, late, restarted


def moving_again(runs: Mapping[str, list[Call]], in_flight: Iterable[str], kill_ms: float,
                 answered_ms: Mapping[str, float]) -> tuple[float | None, float | None]:
    """After a kill at `kill_ms`: (the first `begin` any run wrote after it, the time
    by which every run in flight at the kill had begun a call after it or answered),
    both in ms after the kill; None where that never happened."""
    firsts: list[float] = []
    everyone: list[float] = []
    for run in in_flight:
        begins = [b for call in runs.get(run, []) for b in call.begins if b > kill_ms]
        moved = min(begins) if begins else None
        answered = answered_ms.get(run)
        if moved is not None:
            firsts.append(moved)
        candidates = [t for t in (moved, answered) if t is not None and t > kill_ms]
        everyone.append(min(candidates) if candidates else float("inf"))
    first = min(firsts) - kill_ms if firsts else None
    last = max(everyone, default=float("inf"))
    return first, (None if last == float("inf") else last - kill_ms)


def runs_of(runs: Mapping[str, list[Call]], pid: str, before_ms: float) -> list[str]:
    """The runs whose last call begun before `before_ms` was begun by process `pid`:
    what that process was running then."""
    out = []
    for run, run_calls in runs.items():
        begun = [(b, by) for call in run_calls for b, by in zip(call.begins, call.begun_by,
                                                                strict=True) if b < before_ms]
        if begun and max(begun)[1] == pid:
            out.append(run)
    return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]
