"""asyncio helpers shared by the aiokafka-based roles (worker, gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

__all__ = ["know_topics", "start_when_reachable", "stop_client", "within"]

log = logging.getLogger("threadline")

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """`awaitable`'s result, or TimeoutError after `timeout_s` (None: no limit): what
    `asyncio.wait_for` does, without dropping a cancellation. Python 3.11's wait_for
    runs the awaitable as a task of its own and, when a cancel lands as that task
    completes, returns its result and loses the cancel (python/cpython#86296); a
    revoked worker execution streaming text ran on that way and called a tool its
    successor called too (docs/chaos.md, seed 3008). This awaits in the caller's own
    task under `asyncio.timeout`, as 3.12's wait_for does."""
    if timeout_s is None:  # no timer to arm: a worker waits so for each agent output
        return await awaitable
    async with asyncio.timeout(timeout_s):
        return await awaitable


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


async def know_topics(client: AIOKafkaConsumer, topics: Iterable[str]) -> None:
    """Load the metadata of `topics` into a started `client` now.

    aiokafka learns where a topic's partitions are only when a query misses them, and
    then retries after `retry_backoff_ms` (100 ms): the first offset query of each
    topic on a fresh client waited that long. A restarted worker waited twice (the
    dispatch topic, then the stream topic) between its assignment and its first run.
    aiokafka 0.14 has no public call for this; its client's `add_topic` is what its own
    subscription uses."""
    await asyncio.gather(*(client._client.add_topic(topic) for topic in topics))  # noqa: SLF001


async def start_when_reachable(name: str, start: Callable[[], Awaitable[None]],
                               stop: Callable[[], Awaitable[None]], stall_s: float,
                               pause_s: float = 1.0) -> None:
    """`start()`, started again (after `stop()`, which undoes a partial start) while it
    fails because Kafka does not answer, for `stall_s` at most; then its error.

    aiokafka's `start()` fails at once when no broker answers its bootstrap: a role
    started during a broker restart exited with status 1 (docs/chaos.md, seed 3404)
    where its librdkafka clients wait. The same bound as the topic checks before it
    (`THREADLINE_TOPIC_STALL_S`)."""
    deadline = time.monotonic() + stall_s
    while True:
        try:
            await start()
            return
        except (KafkaError, OSError) as exc:
            with contextlib.suppress(Exception):
                await stop()
            if time.monotonic() + pause_s > deadline:
                raise
            log.warning("%s: Kafka did not answer (%s: %s); starting again in %.0f s", name,
                        type(exc).__name__, exc, pause_s)
            await asyncio.sleep(pause_s)
