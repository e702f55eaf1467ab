"""The fault point of the table loop (streams/kafka/faults.py): off unless armed,
fires only on a step that writes a record with the armed prefix, once, in one of
the processes sharing the trigger, after flushing."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from streams.kafka.faults import FAULT_ENV, FAULT_EXIT_STATUS, arm, commit_fault


@dataclass(frozen=True)
class Out:
    """A written record, as the loop's Output has it."""
    key: bytes


class Producer:
    """Counts flushes."""

    def __init__(self) -> None:
        self.flushes = 0

    def flush(self, timeout: float) -> int:
        """Nothing left to deliver."""
        self.flushes += 1
        return 0


class Exited(Exception):
    """os._exit, caught."""


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """os._exit replaced by an exception that records the status."""
    statuses: list[int] = []

    def _exit(status: int) -> None:
        statuses.append(status)
        raise Exited

    monkeypatch.setattr(os, "_exit", _exit)
    return statuses


def test_no_fault_point_unless_armed_by_the_environment() -> None:
    """Without the variable the loop gets no fault point at all."""
    assert commit_fault({}) is None


def test_it_fires_once_on_the_armed_prefix_after_flushing(tmp_path: Path, exits: list[int]) -> None:
    """Nothing happens until a step writes a key with the prefix; then it flushes,
    takes the trigger and exits with its status; armed no more, it never fires again."""
    trigger = tmp_path / "trigger"
    fault = commit_fault({FAULT_ENV: str(trigger)})
    assert fault is not None
    producer = Producer()
    fault([Out(b"fault-1")], producer)  # not armed yet
    arm(trigger, "fault-")
    fault([Out(b"thread-1"), Out(b"other")], producer)  # armed, no key of the burst
    assert (exits, producer.flushes) == ([], 0)
    with pytest.raises(Exited):
        fault([Out(b"thread-2"), Out(b"fault-7")], producer)
    assert (exits, producer.flushes) == ([FAULT_EXIT_STATUS], 1)
    assert not trigger.exists()
    assert [p.name for p in tmp_path.iterdir()] == [f"trigger.fired-{os.getpid()}"]
    fault([Out(b"fault-8")], producer)  # taken: fires no more
    assert exits == [FAULT_EXIT_STATUS]


def test_of_two_processes_sharing_a_trigger_only_one_fires(tmp_path: Path, exits: list[int]) -> None:
    """The first to take the trigger fires; the other finds it gone."""
    trigger = tmp_path / "trigger"
    first, second = (commit_fault({FAULT_ENV: str(trigger)}) for _ in range(2))
    assert first is not None and second is not None
    arm(trigger, "fault-")
    with pytest.raises(Exited):
        first([Out(b"fault-1")], Producer())
    second([Out(b"fault-1")], Producer())
    assert exits == [FAULT_EXIT_STATUS]
