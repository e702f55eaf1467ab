"""What the driver needs of a system under test: start it, run one agent run (post,
then wait for the answer), its processes, kill and restart a role, stop it."""

from __future__ import annotations

import abc
import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.peers.procs import Proc

__all__ = ["Missing", "System"]


class Missing(Exception):
    """The system could not be installed or started here: reported as missing, never faked."""


class System(abc.ABC):
    """One system of the comparison, started fresh for each round in `folder`."""

    name: str = ""
    roles: tuple[str, ...] = ()  # the roles the recovery test kills, one at a time
    # The roles that can also be lost for good: a second instance is started, the
    # first killed and not restarted (`add_instance`, `kill`, `lost`).
    lost_roles: tuple[str, ...] = ()
    settle_s: float = 0.0  # wait after `prepare` before a recovery test's runs are posted

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tool_log = folder / "side-effects.log"
        self.procs: dict[str, Proc] = {}
        # When a run was posted, where `run` does more than post first (a client's
        # stream opened before): the driver's clock starts here then.
        self.posted_at: dict[str, float] = {}
        # Processes of the system that exited by themselves and were started again.
        self.self_exits: list[str] = []

    @abc.abstractmethod
    async def start(self, session: aiohttp.ClientSession) -> None:
        """Start every process of the system and wait until it serves."""

    async def set_delay(self, session: aiohttp.ClientSession, delay_s: float) -> None:  # noqa: B027
        """Make each tool call take `delay_s` from now on (most systems take it per run)."""

    async def prepare(self, session: aiohttp.ClientSession, count: int) -> list[str]:
        """What `count` runs need before they are posted (threads), outside the clock."""
        return [""] * count

    @abc.abstractmethod
    async def run(self, session: aiohttp.ClientSession, slot: str, key: str, delay_s: float,
                  deadline: float, ids: dict[str, str]) -> float | None:
        """Post one run of the workload and wait for its answer: the wall time (time.time())
        the answer was available, None if not by `deadline` (monotonic). Sets `ids[key]` to
        the run's name in the side-effect log as soon as it is known. Survives the system's
        processes being killed and restarted meanwhile (posting again idempotently)."""

    def roots(self) -> dict[str, int]:
        """The root process of each part of the system, by name (their trees are measured)."""
        return {name: p.pid for name, p in self.procs.items() if p.alive()}

    async def kill(self, role: str) -> None:
        """SIGKILL `role`."""
        self.procs[role].kill9()

    async def restart(self, role: str) -> None:
        """Start `role` again in place, as a supervisor would."""
        self.procs[role].start()

    async def add_instance(self, role: str) -> None:
        """Start a second instance of `role` and wait until the two share its work."""
        raise NotImplementedError(f"{self.name} cannot run a second {role}")

    async def lost(self, role: str) -> None:  # noqa: B027
        """`role` was killed for good: the second instance stands for it from now on."""

    def serving_again(self, role: str, kill_ms: float) -> float | None:
        """Seconds from the kill to the first decision or dispatch on the work the dead
        `role` owned, when the system can tell (else None: the driver's first call begun)."""
        return None

    def milestones(self, role: str, kill_ms: float) -> dict[str, float]:
        """What the restarted `role` logged after the kill: event -> seconds after it."""
        return {}

    @abc.abstractmethod
    def version(self) -> str:
        """The versions that ran."""

    @abc.abstractmethod
    def durability(self) -> str:
        """Its durability settings as they ran (fsync, replication, acks)."""

    def settings(self) -> str:
        """What was set apart from the shipped defaults, and why."""
        return "shipped defaults"

    async def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL)."""
        for proc in reversed(list(self.procs.values())):
            await asyncio.to_thread(proc.stop)


async def answered_ok(session: aiohttp.ClientSession, method: str, url: str, deadline: float, *,
                     pause_s: float = 0.2, **request: Any) -> bool:
    """Send the request until it is answered 200 (True), retrying after connection
    errors and other statuses every `pause_s`; False once `deadline` (monotonic) passed."""
    while True:
        try:
            async with session.request(method, url, **request) as response:
                await response.read()
                if response.status == 200:
                    return True
        except aiohttp.ClientError:
            pass
        if not await retry_pause(deadline, pause_s):
            return False


async def retry_pause(deadline: float, seconds: float = 0.2) -> bool:
    """Sleep before a retry; False once `deadline` (monotonic) has passed."""
    if time.monotonic() >= deadline:
        return False
    await asyncio.sleep(seconds)
    return True
