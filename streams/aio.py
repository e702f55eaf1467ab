"""asyncio helpers shared by the aiokafka-based roles (worker, gateway)."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

__all__ = ["stop_client"]

log = logging.getLogger("threadline")


async def stop_client(client: AIOKafkaConsumer | AIOKafkaProducer) -> None:
    """Stop an aiokafka client. aiokafka 0.14's fetcher, closed while it backs off
    after a failed fetch, re-raises its own task's CancelledError from `stop()`;
    that one is swallowed, a cancellation of the caller is not."""
    try:
        await client.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.warning("aiokafka leaked a CancelledError while stopping %s", type(client).__name__)
