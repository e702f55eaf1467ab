"""A Threadline stack of real processes for the end-to-end benchmarks: processor,
worker and gateway (each `threadline <role>`), on fresh topics of the run's broker."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.common import VAR, Child, bench_env, cleanup
from streams.config import Settings
from streams.devtools.broker import free_port
from streams.kafka.topics import ensure_topics

AUTH = {"Authorization": "Bearer bench"}


@dataclass
class Stack:
    """A benchmark stack: its environment, settings, log folder and the role processes started."""
    env: dict[str, str]
    settings: Settings
    folder: Path
    children: dict[str, Child] = field(default_factory=dict)

    @property
    def base(self) -> str:
        """The gateway's base URL on 127.0.0.1."""
        return f"http://127.0.0.1:{self.settings.gateway.http_port}"

    def start(self, roles: Iterable[str], nofile: int | None = None) -> Stack:
        """Start a process for each of `roles` (the gateway with `nofile` open files at most)."""
        for role in roles:
            self.children[role] = Child.role(role, self.env, self.folder,
                                             nofile if role == "gateway" else None)
        return self

    def mark(self) -> None:
        """Start counting every process's CPU from now."""
        for child in self.children.values():
            child.mark()

    def cpu_us_per(self, events: int) -> dict[str, float]:
        """Microseconds of CPU per event that each process used since `mark()`."""
        return {name: child.cpu_since_mark() / max(events, 1) * 1e6
                for name, child in self.children.items()}

    def stop(self) -> None:
        """Stop every process and remove the run's data folder."""
        for child in self.children.values():
            child.stop()
        cleanup(self.settings)

    async def healthy(self, session: aiohttp.ClientSession, timeout: float = 120) -> None:
        """/healthz says ok; a gateway alone (no processor, no worker) is ready when
        only those groups' members are missing."""
        alone = "processor" not in self.children
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, child in self.children.items():
                if not child.alive():
                    raise RuntimeError(f"{name} exited:\n{child.tail()}")
            try:
                async with session.get(f"{self.base}/healthz") as response:
                    body = await response.json()
                    if response.status == 200 or (alone and body["broker"]["ok"]
                                                   and body["read_model"]["loaded"]):
                        return
                    last = json.dumps(body)
            except aiohttp.ClientError as exc:
                last = str(exc)
            await asyncio.sleep(0.3)
        raise RuntimeError(f"gateway not healthy after {timeout}s: {last}\n"
                           f"{self.children['gateway'].tail()}")

    async def create_threads(self, session: aiohttp.ClientSession, count: int,
                             parallel: int = 32) -> list[str]:
        """`count` threads through the gateway (each a CreateThread decided by the processor)."""
        out: list[str] = []
        gate = asyncio.Semaphore(parallel)

        async def one(i: int) -> None:
            async with gate, session.post(f"{self.base}/v1/threads", json={"title": f"t{i}"},
                                          headers=AUTH) as response:
                body = await response.json()
                if response.status not in (201, 202):
                    raise RuntimeError(f"create thread: {response.status} {body}")
                out.append(body["thread_id"])

        await asyncio.gather(*(one(i) for i in range(count)))
        return out


def new_stack(bootstrap: str, partitions: int = 12, **extra: str) -> Stack:
    """A stack (not yet started) on fresh topics of `bootstrap`, with a free HTTP port for its gateway."""
    env = bench_env(bootstrap, partitions, THREADLINE_HTTP_PORT=str(free_port()), **extra)
    settings = Settings.from_env(env)
    ensure_topics(settings)
    folder = VAR / "bench-logs" / settings.topic_prefix.rstrip(".")
    return Stack(env, settings, folder)
