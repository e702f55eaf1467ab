"""Keep child processes running: what `threadline run` does for its roles.

Roles are crash-only: the processor exits on a failed transactional call and
relies on being started again. So a child that exits, whatever its status, is
started again: at once after its first exit in a row, then after a backoff
(`Backoff`: 0.5 s doubling to 30 s; a child that stayed up `stable_s` starts again
at once), and each exit is logged with the
child's name, pid and status (the signal's name when it was killed). Only
`Supervisor.stop` (SIGTERM or Ctrl-C in `threadline run`) ends the loop; the
children are then terminated and waited for.

The backoff and the exit descriptions are pure functions; `Supervisor` is the
loop around them.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Backoff", "Child", "ProcessChild", "Supervisor", "describe_exit", "die_with_parent"]

log = logging.getLogger("threadline.supervisor")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before restart number `failures` in a row (1-based)."""

    # A crash is restarted at once, as systemd and Kubernetes do: a broker killed under
    # `threadline run` came back 0.5 s later for nothing. A child that keeps exiting
    # waits initial_s, doubling.
    first_s: float = 0.0
    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    stable_s: float = 60.0  # a child up this long had recovered: its next exit counts from 1

    def delay(self, failures: int) -> float:
        """Seconds to wait before a restart after this many failures in a row, capped at max_s."""
        if failures <= 1:
            return self.first_s
        # The exponent is capped so that many failures never overflow a float.
        exponent = min(failures - 2, 64)
        return float(min(self.max_s, self.initial_s * self.factor ** exponent))

    def failures_after(self, failures: int, uptime_s: float) -> int:
        """Failures in a row once a child that ran `uptime_s` exits again."""
        return 1 if uptime_s >= self.stable_s else failures + 1


def describe_exit(status: int) -> str:
    """`Popen.returncode` in words: `killed by SIGKILL`, `exited with status 70`."""
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exited with status {status}"


class Child(Protocol):
    """A process the supervisor keeps running."""

    name: str

    def start(self) -> int:
        """Start it; return its pid."""

    def poll(self) -> int | None:
        """Its exit status once it has exited (negative: killed by that signal), else None."""

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM) without waiting."""

    def wait(self, timeout_s: float) -> None:
        """Wait for it to exit; kill it if it is still running after `timeout_s`."""


def die_with_parent() -> None:
    """Ask the kernel to send this process SIGTERM when its parent dies (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing): a child's `preexec_fn`, so a killed
    launcher leaves no orphan role, broker or registry."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


@dataclass
class ProcessChild:
    """A child started as `argv` with `env`."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> int:
        """Start the child process and return its pid."""
        self.process = subprocess.Popen(list(self.argv), env=self.env, stdin=subprocess.DEVNULL,
                                        preexec_fn=die_with_parent)
        return self.process.pid

    def poll(self) -> int | None:
        """The child's exit code, or None while it runs (or before it started)."""
        return None if self.process is None else self.process.poll()

    def terminate(self) -> None:
        """Send SIGTERM to the child if it is running."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def wait(self, timeout_s: float) -> None:
        """Wait for the child to exit, killing it after timeout_s."""
        if self.process is None:
            return
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class _Slot:
    child: Child
    pid: int = 0
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None  # set while the child is down, waiting for its backoff


class Supervisor:
    """Start the children, restart each one that exits, until `stop()`.

    `base` (the embedded broker) is started before the children and stopped after
    them, so that they can shut down cleanly against it; it is restarted like them.
    """

    def __init__(self, children: Sequence[Child], backoff: Backoff = Backoff(), *,
                 base: Child | None = None, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = 0.05) -> None:  # an exit is seen within 50 ms
        self.base = None if base is None else _Slot(base)
        self.children = [_Slot(c) for c in children]
        self.backoff = backoff
        self.clock = clock
        self.poll_s = poll_s
        self.restarts = 0
        self.rounds = 0  # `check` calls so far: a watcher's sign that the loop goes on
        self._stop = threading.Event()

    @property
    def slots(self) -> list[_Slot]:
        """Every supervised slot: the base (if any) first, then the children."""
        return [*([] if self.base is None else [self.base]), *self.children]

    def stop(self) -> None:
        """Ask `run` to return; safe from a signal handler."""
        self._stop.set()

    def _start(self, slot: _Slot) -> None:
        slot.pid = slot.child.start()
        slot.started_at = self.clock()
        slot.restart_at = None

    def check(self) -> None:
        """One round: note the children that exited, start those whose backoff is over."""
        self.rounds += 1
        now = self.clock()
        for slot in self.slots:
            if slot.restart_at is None:
                status = slot.child.poll()
                if status is None:
                    continue
                up_s = now - slot.started_at
                slot.failures = self.backoff.failures_after(slot.failures, up_s)
                delay = self.backoff.delay(slot.failures)
                slot.restart_at = now + delay
                log.warning("role %s (pid %d) %s after %.1f s up; restarting it in %.1f s "
                            "(failure %d in a row)", slot.child.name, slot.pid, describe_exit(status),
                            up_s, delay, slot.failures)
            if slot.restart_at is not None and now >= slot.restart_at and not self._stop.is_set():
                self._start(slot)
                self.restarts += 1
                log.warning("role %s restarted (pid %d)", slot.child.name, slot.pid)

    def run(self, stop_timeout_s: float = 20.0) -> None:
        """Start every child, keep them running until `stop()`, then stop them all."""
        try:
            for slot in self.slots:
                if not self._stop.is_set():
                    self._start(slot)
            while not self._stop.wait(self.poll_s):
                self.check()
        finally:
            for group in ([s.child for s in self.children],
                          [] if self.base is None else [self.base.child]):
                for child in group:
                    child.terminate()
                for child in group:
                    child.wait(stop_timeout_s)
