"""`streams.aio.within`: a timeout that never drops a cancellation (docs/chaos.md,
seed 3008: Python 3.11's `asyncio.wait_for` does)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from streams.aio import within


async def _cancelled_as_the_get_completes(
        wait: Callable[[Awaitable[object], float], Coroutine[Any, Any, object]]) -> bool:
    """Whether a task waiting on a queue under `wait` ends cancelled when an item
    arrives and the task is cancelled in the same loop iteration."""
    queue: asyncio.Queue[object] = asyncio.Queue()
    task: asyncio.Task[object] = asyncio.create_task(wait(queue.get(), 10.0))
    for _ in range(3):
        await asyncio.sleep(0)  # the task waits in get()
    queue.put_nowait("item")  # the get completes...
    task.cancel()  # ...and the cancel lands in the same iteration
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


async def test_within_keeps_a_cancel_that_lands_as_the_awaited_get_completes() -> None:
    """A cancel that lands as the awaited get completes cancels the task, every time."""
    for _ in range(50):
        assert await _cancelled_as_the_get_completes(within)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's wait_for keeps the cancel")
async def test_the_race_is_real_asyncio_wait_for_drops_that_cancel_on_311() -> None:
    """The negative control: on 3.11 the same race through asyncio.wait_for returns the
    item and loses the cancel, so the test above can fail."""
    assert not await _cancelled_as_the_get_completes(asyncio.wait_for)


async def test_within_times_out_and_gives_the_result_in_time() -> None:
    """Like wait_for otherwise: TimeoutError past the limit, the result within it."""
    with pytest.raises(TimeoutError):
        await within(asyncio.Event().wait(), 0.01)
    assert await within(asyncio.sleep(0, "done"), None) == "done"
