"""The supervisor of `threadline run`: the backoff as pure code, the loop with a
manual clock, and real processes killed with SIGKILL."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.supervisor import Backoff, ProcessChild, Supervisor, describe_exit
from streams.testing.process import wait_for
from tests.manual_clock import ManualClock


def test_a_first_exit_restarts_at_once_then_the_backoff_doubles_from_half_a_second_to_thirty() -> None:
    """The first restart in a row is at once; then delays double from 0.5 s and stop at 30 s."""
    backoff = Backoff()
    assert [backoff.delay(n) for n in range(1, 10)] == [0, 0.5, 1, 2, 4, 8, 16, 30, 30]


@given(st.integers(min_value=-5, max_value=10**9))
def test_the_backoff_stays_within_its_bounds_whatever_the_failure_count(failures: int) -> None:
    """The restart delay stays between its first and its largest value for any failure count."""
    backoff = Backoff()
    assert backoff.first_s <= backoff.delay(failures) <= backoff.max_s


@given(st.integers(min_value=1, max_value=10**6))
def test_the_backoff_never_decreases_with_more_failures(failures: int) -> None:
    """More failures in a row never give a shorter delay."""
    backoff = Backoff(initial_s=0.1, factor=3.0, max_s=1e9)
    assert backoff.delay(failures + 1) >= backoff.delay(failures)


def test_a_child_that_stayed_up_long_enough_starts_again_from_the_first_delay() -> None:
    """A child that ran for stable_s before exiting counts as its first failure again."""
    backoff = Backoff(stable_s=60)
    assert backoff.failures_after(5, uptime_s=59.9) == 6
    assert backoff.failures_after(5, uptime_s=60.0) == 1
    assert backoff.failures_after(0, uptime_s=0.0) == 1


@pytest.mark.parametrize(("status", "words"), [
    (-9, "killed by SIGKILL"), (-15, "killed by SIGTERM"), (0, "exited with status 0"),
    (70, "exited with status 70"), (-200, "killed by signal 200"),
])
def test_an_exit_status_is_described_with_its_signal_name(status: int, words: str) -> None:
    """Exit statuses are described with the signal's name, or the status number."""
    assert describe_exit(status) == words


@dataclass
class _FakeChild:
    """A child whose exits the test decides (the supervisor's loop logic alone)."""

    name: str
    starts: int = 0
    status: int | None = None
    events: list[str] = field(default_factory=list)

    def start(self) -> int:
        self.starts += 1
        self.status = None
        return 1000 + self.starts

    def poll(self) -> int | None:
        return self.status

    def terminate(self) -> None:
        self.events.append(f"terminate {self.name}")

    def wait(self, timeout_s: float) -> None:
        self.events.append(f"wait {self.name}")


def _within_rounds(supervisor: Supervisor, done: Callable[[], object], rounds: int = 200) -> None:
    """Wait until `done()`: failing once the supervisor's loop went `rounds` rounds
    without it (a count, not seconds: a loaded machine makes rounds slower, not more),
    or no round at all for 30 s (the loop stuck)."""
    first = supervisor.rounds

    def met() -> bool:
        if done():
            return True
        assert supervisor.rounds - first <= rounds, f"not done in {rounds} supervisor rounds"
        return False
    wait_for(met, progress=lambda: supervisor.rounds)


def test_an_exited_child_is_restarted_after_a_growing_delay_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """A child that keeps crashing is restarted after growing delays, each logged."""
    clock = ManualClock()
    child = _FakeChild("processor")
    supervisor = Supervisor([child], Backoff(stable_s=60), clock=clock)
    supervisor._start(supervisor.slots[0])
    caplog.set_level(logging.WARNING, "threadline.supervisor")
    restarts_at: list[float] = []
    for _ in range(4):  # crash at once after every start
        child.status = -signal.SIGKILL
        starts = child.starts
        while child.starts == starts:
            supervisor.check()
            clock.now += 0.25
        restarts_at.append(clock.now)
    gaps = [b - a for a, b in zip([0.0, *restarts_at], restarts_at, strict=False)]
    assert gaps == [0.25, 0.75, 1.25, 2.25]  # delays 0, 0.5, 1, 2 on a 0.25 s poll
    assert "role processor (pid 1001) killed by SIGKILL" in caplog.text
    assert "failure 4 in a row" in caplog.text
    clock.now += 61  # up long enough: its next exit starts from the first delay
    child.status = 1
    supervisor.check()
    assert "exited with status 1 after 61.2 s up; restarting it in 0.0 s (failure 1 in a row)" \
        in caplog.text


def test_stop_restarts_nothing_and_stops_the_children_before_the_base() -> None:
    """stop() ends every child before the broker base, restarting none."""
    events: list[str] = []
    broker = _FakeChild("broker", events=events)
    roles = [_FakeChild(n, events=events) for n in ("processor", "gateway")]
    supervisor = Supervisor(roles, base=broker, poll_s=0.01)
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    _within_rounds(supervisor, lambda: roles[1].starts == 1)
    roles[0].status = 0
    _within_rounds(supervisor, lambda: roles[0].starts == 2)  # an exit with status 0 too
    supervisor.stop()
    runner.join()
    assert events == ["terminate processor", "terminate gateway", "wait processor", "wait gateway",
                      "terminate broker", "wait broker"]
    assert broker.starts == 1


def test_a_real_process_killed_with_sigkill_is_started_again(caplog: pytest.LogCaptureFixture) -> None:
    """A real child process killed with SIGKILL is started again with a new pid, and logged."""
    caplog.set_level(logging.WARNING, "threadline.supervisor")
    child = ProcessChild("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
    supervisor = Supervisor([child], Backoff(initial_s=0.05), poll_s=0.05)
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        _within_rounds(supervisor, lambda: child.process)
        assert child.process is not None
        first = child.process.pid
        os.kill(first, signal.SIGKILL)
        _within_rounds(supervisor, lambda: supervisor.restarts == 1)
        assert child.process is not None and child.process.pid != first
        assert child.poll() is None
        assert f"role sleeper (pid {first}) killed by SIGKILL" in caplog.text
    finally:
        supervisor.stop()
        runner.join()
    assert child.process is not None and child.process.returncode == -signal.SIGTERM
