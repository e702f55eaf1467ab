"""Replay recorded thread histories through today's core, as temporalio's Replayer does.

A history is JSON: the policy it was decided with, an optional starting state, and
each event with the state `evolve` made of it when it was recorded. `replay` folds
the events through today's `streams.core.thread.evolve` and compares every state with the
recorded one, so a change to the core that would misread old history fails loudly.
The JSON form is this module's own (`to_json`/`from_json`, driven by the dataclasses'
type hints), independent of the Avro wire format, so it changes only on purpose.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from streams.core import domain
from streams.core.domain import Event, Policy, ThreadState
from streams.core.thread import evolve

__all__ = ["History", "ReplayMismatch", "Step", "from_json", "load_history", "replay",
           "save_history", "to_json"]

_EVENT_TYPES: dict[str, type[Any]] = {t.__name__: t for t in typing.get_args(Event)}


class ReplayMismatch(AssertionError):
    """Today's core folds a recorded event into a different state than was recorded."""


@dataclass(frozen=True)
class Step:
    """One recorded event and the state the core made of it."""

    event: Event
    state: ThreadState | None


@dataclass(frozen=True)
class History:
    """A recorded run of one thread: what it was decided with and what it became."""

    name: str
    description: str
    policy: Policy
    steps: tuple[Step, ...]
    start: ThreadState | None = None  # a state the events were folded onto (e.g. migrated 0.1)


@cache
def _hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(domain))


def to_json(value: Any) -> Any:
    """`value` (a domain dataclass, enum, tuple, mapping or plain value) as JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def from_json(tp: Any, data: Any) -> Any:
    """The value of type `tp` that `to_json` wrote as `data`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return from_json(members[0], data)
        raise TypeError(f"ambiguous union {tp}: tag the value (see event_from_json)")
    if origin is tuple:
        return tuple(from_json(args[0], v) for v in data)
    if origin is not None and issubclass(origin, Mapping):
        return types.MappingProxyType({k: from_json(args[1], v) for k, v in data.items()})
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        return tp(**{f.name: from_json(hints[f.name], data[f.name])
                     for f in dataclasses.fields(tp) if f.name in data})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    if tp is float:
        return float(data)
    return data


def event_to_json(event: Event) -> dict[str, Any]:
    """An event as JSON data, tagged with its type's name."""
    return {"type": type(event).__name__, **to_json(event)}


def event_from_json(data: Mapping[str, Any]) -> Event:
    """The event `event_to_json` wrote."""
    fields = dict(data)
    event: Event = from_json(_EVENT_TYPES[fields.pop("type")], fields)
    return event


def save_history(history: History, path: Path) -> None:
    """Write `history` to `path` as indented JSON (stable, so a diff shows what changed)."""
    data = {
        "name": history.name, "description": history.description,
        "policy": to_json(history.policy), "start": to_json(history.start),
        "steps": [{"event": event_to_json(s.event), "state": to_json(s.state)} for s in history.steps],
    }
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


def load_history(path: Path) -> History:
    """The history `save_history` wrote to `path`."""
    data = json.loads(path.read_text())
    return History(
        name=data["name"], description=data["description"],
        policy=from_json(Policy, data["policy"]),
        start=from_json(ThreadState | None, data["start"]),
        steps=tuple(Step(event_from_json(s["event"]), from_json(ThreadState | None, s["state"]))
                    for s in data["steps"]),
    )


def replayed(history: History) -> Iterator[tuple[Step, ThreadState | None]]:
    """Each recorded step with the state today's `evolve` makes of its event."""
    state = history.start
    for step in history.steps:
        state = evolve(state, step.event, history.policy)
        yield step, state


def replay(history: History) -> None:
    """Fold the history through today's `evolve`; raise `ReplayMismatch` at the first
    state that differs from the recorded one (compared as JSON, so a mapping's kind
    does not matter, its content does)."""
    for index, (step, state) in enumerate(replayed(history)):
        if to_json(state) != to_json(step.state):
            raise ReplayMismatch(
                f"{history.name}: step {index} ({type(step.event).__name__}) folds to\n"
                f"  {to_json(state)}\nbut was recorded as\n  {to_json(step.state)}")
