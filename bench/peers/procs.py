"""External processes of the peers: started in their own process group with their
output in a log, killed with SIGKILL as a crash would, and the CPU of their whole
process tree read from /proc."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["Proc", "cpu_by_root", "cpu_used", "free_port", "tree_cpu", "tree_pids"]

_TICKS = os.sysconf("SC_CLK_TCK")


def _own_group_dying_with_us() -> None:
    os.setsid()
    # PR_SET_PDEATHSIG: SIGTERM if the benchmark dies, so that nothing outlives it.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree_pids(roots: Iterable[int]) -> list[int]:
    """The roots and every live descendant."""
    kids, out, todo = _children(), [], list(roots)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime, stime, and the reaped children's cutime, cstime
    return sum(int(x) for x in fields[11:15]) / _TICKS


def tree_cpu(roots: Iterable[int]) -> dict[int, float]:
    """CPU seconds (user + system, reaped children included) of every process of the trees."""
    return {pid: _cpu(pid) for pid in tree_pids(roots)}


def cpu_by_root(roots: dict[str, int]) -> dict[str, dict[int, float]]:
    """`tree_cpu` of each named root apart."""
    return {name: tree_cpu([pid]) for name, pid in roots.items()}


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of `pid`, summed by thread name with
    its digits as N (a JVM's `C2 CompilerThread0` and `1` are `CN CompilerThreN`)."""
    out: dict[str, float] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                name = re.sub(r"[0-9]+", "N", f.read().strip())
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TICKS
    return out


def jit_cpu(roots: Iterable[int]) -> float:
    """CPU seconds of the JIT compiler threads (a JVM's `C1/C2 CompilerThread`) of the
    trees: a JVM's start-up cost that a long-running broker pays once."""
    return sum(seconds for pid in tree_pids(roots) for name, seconds in thread_cpu(pid).items()
               if "CompilerThre" in name)


def cpu_used(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) \
        -> dict[str, float]:
    """CPU seconds each named tree used between two `cpu_by_root` readings (a process
    that appeared between them counts from zero)."""
    return {name: sum(v - before.get(name, {}).get(pid, 0.0) for pid, v in tree.items())
            for name, tree in after.items()}


class Proc:
    """A command as a child in its own process group, output appended to `log`."""

    def __init__(self, name: str, args: Sequence[str], env: Mapping[str, str], log: Path,
                 cwd: Path | None = None) -> None:
        self.name, self.args, self.env, self.log, self.cwd = name, list(args), dict(env), log, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        """Start (again)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.args, env={**os.environ, **self.env}, cwd=self.cwd, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_own_group_dying_with_us)
        return self

    @property
    def pid(self) -> int:
        """The current start's process id."""
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def alive(self) -> bool:
        """True while the current start runs."""
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group, as a crash would, and reap the leader."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM to the group, SIGKILL after `timeout` s."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.kill9()

    def tail(self, n: int = 25) -> str:
        """The log's last `n` lines."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""


def wait_port(port: int, timeout: float, procs: Sequence[Proc] = ()) -> None:
    """Until 127.0.0.1:`port` accepts a connection; fail if one of `procs` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if not p.alive():
                raise RuntimeError(f"{p.name} exited:\n{p.tail()}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {timeout} s")
