"""A Threadline role (or any Python module) as a child process, for tests, the chaos
program, the benchmarks and users testing their own agents: start it, wait for a line
in its log, kill it with SIGKILL as a crash would, restart it, stop it."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

from streams.supervisor import die_with_parent

__all__ = ["ROOT", "ChildProcess", "RoleProcess", "logs_of", "process_cpu", "role_args",
           "wait_for"]

ROOT = Path(__file__).resolve().parent.parent.parent
T = TypeVar("T")


def role_args(role: str) -> list[str]:
    """The interpreter arguments that run `role`: the gateway by its module name, the
    others as `streams.cli <role>` (what `threadline <role>` runs)."""
    return ["-m", "gateway"] if role == "gateway" else ["-m", "streams.cli", role]


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.1,
             progress: Callable[[], object] | None = None) -> T:
    """Poll `predicate` until it returns something true, and return that; fail after
    `timeout`. With `progress`, the wait is bounded by progress instead: it fails
    once `progress()` returned no value not seen before for `timeout` seconds."""
    since, seen = time.monotonic(), set()
    while True:
        value = predicate()
        if value:
            return value
        if progress is not None:
            now = repr(progress())
            if now not in seen:
                since = time.monotonic()
                seen.add(now)
        if time.monotonic() - since > timeout:
            break
        time.sleep(interval)
    raise AssertionError(f"condition not met, no progress in {timeout}s" if progress is not None
                         else f"condition not met within {timeout}s")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process (from /proc, all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def logs_of(*paths: Path) -> Callable[[], tuple[int, ...]]:
    """A `wait_for` progress: the sizes of these log files, which grow while the
    processes writing them work (a loaded machine is slow, not stuck)."""
    def sizes() -> tuple[int, ...]:
        return tuple(p.stat().st_size if p.exists() else 0 for p in paths)
    return sizes


class ChildProcess:
    """`python <args>` as a child with its output in a log file, killable like a crash
    would kill it and restartable with the same arguments and environment."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str], log: Path, *,
                 cwd: Path | str | None = None, nofile: int | None = None,
                 die_with_parent: bool = False) -> None:
        self.name, self.args, self.env, self.log = name, args, dict(env), log
        self.cwd = cwd if cwd is not None else ROOT
        self.nofile, self.die_with_parent = nofile, die_with_parent
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._log_offset = 0  # where this start's output begins in the log

    def _preexec(self) -> None:
        if self.nofile:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(self.nofile, hard), hard))
        if self.die_with_parent:
            die_with_parent()  # a killed launcher leaves no orphans

    def start(self) -> Self:
        """Start the process (again); its output is appended to the log."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, *self.args], env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
                cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=self._preexec if self.nofile or self.die_with_parent else None)
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        """The process id of the current start."""
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def alive(self) -> bool:
        """True while the current start runs."""
        return self.proc is not None and self.proc.poll() is None

    def exited(self) -> int | None:
        """The exit status if the process ended, else None."""
        return None if self.proc is None else self.proc.poll()

    def kill9(self) -> None:
        """SIGKILL, as a crash or an OOM kill would end it, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> Self:
        """SIGKILL the process if it runs, then start it again."""
        self.kill9()
        return self.start()

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM, then SIGKILL if it has not ended within `timeout` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def wait(self, timeout: float) -> int:
        """The exit status once the process ends; killed and an error after `timeout`."""
        assert self.proc is not None, f"{self.name} was never started"
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"{self.name} did not finish in {timeout}s:\n{self.tail()}") from None

    def output(self) -> str:
        """What the current start has written to the log so far."""
        try:
            with open(self.log, "rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, marker: str, timeout: float = 60.0) -> None:
        """Wait until the current start writes `marker`, while it makes progress: fail
        once it wrote nothing for `timeout` seconds, or at once if it exits first."""
        since, written = time.monotonic(), -1
        while marker not in (output := self.output()):
            if self.exited() is not None:
                if marker in self.output():  # written just before it ended
                    return
                raise AssertionError(f"{self.name} exited ({self.exited()}) before {marker!r}:\n"
                                     f"{self.tail()}")
            if len(output) > written:  # a starting role logs each step it gets through
                since, written = time.monotonic(), len(output)
            elif time.monotonic() - since > timeout:
                raise AssertionError(f"{self.name}: no {marker!r}, and nothing logged for {timeout}s:\n"
                                     f"{self.tail()}")
            time.sleep(0.05)

    def cpu(self) -> float:
        """CPU seconds the current start has used so far (OSError once it is reaped)."""
        return process_cpu(self.pid)

    def wait_for_file(self, path: Path, timeout: float = 30.0) -> str:
        """The text of `path` once the current start has written it (a server's port
        file, say): waiting while the process uses CPU (it works without logging, as
        one starting up does: a loaded machine makes it slow, not stuck), failing once
        it used none for `timeout` seconds, or at once if it exits first."""
        def written() -> str:
            text = path.read_text() if path.exists() else ""
            if not text and self.exited() is not None:
                raise AssertionError(f"{self.name} exited ({self.exited()}) before writing "
                                     f"{path}:\n{self.tail()}")
            return text

        def used() -> float:
            try:
                return self.cpu()
            except OSError:  # it ended since: `written` says so next
                return 0.0
        return wait_for(written, timeout, interval=0.05, progress=used)

    def tail(self, n: int = 40) -> str:
        """The last `n` lines of the log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""


class RoleProcess(ChildProcess):
    """One Threadline role (`processor`, `worker`, `gateway`, `connector`, ...) as a process."""

    def __init__(self, role: str, env: Mapping[str, str], log: Path, *, name: str | None = None,
                 **options: Any) -> None:
        super().__init__(name or role, role_args(role), env, log, **options)
        self.role = role

