"""The `threadline worker` role: one `Worker` until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import signal

from streams.agents import create_agent
from streams.config import Settings
from streams.worker.group import Worker

__all__ = ["run_worker"]


def run_worker(settings: Settings) -> int:
    """The `threadline worker` role: run until SIGTERM or SIGINT, then exit 0."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Worker(settings, create_agent(settings)).run(stop)

    asyncio.run(main())
    return 0
