"""A small SSE client for tests and load: frames parsed as a browser's EventSource
parses them (`id`, `event`, multi-line `data`, comments ignored)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

__all__ = ["SseEvent", "SseParser", "iter_sse", "iter_sse_idle", "read_sse", "until_done",
           "until_opened"]


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One event as a client received it; `id` is None when the frame had none."""

    id: str | None
    event: str
    data: str

    @property
    def json(self) -> Any:
        """The data, parsed as JSON."""
        return json.loads(self.data)


class SseParser:
    """Turns the lines of an event stream into events, one complete frame at a time."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.id: str | None = None
        self.name = "message"
        self.data: list[str] = []
        self.has_data = False

    def feed(self, raw: bytes) -> SseEvent | None:
        """Take one line; the event it completes, if any."""
        line = raw.decode().rstrip("\r\n")
        if not line:
            event = SseEvent(self.id, self.name, "\n".join(self.data)) if self.has_data else None
            self._reset()
            return event
        if line.startswith(":"):
            return None
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "id":
            self.id = value
        elif key == "event":
            self.name = value
        elif key == "data":
            self.data.append(value)
            self.has_data = True
        return None


async def iter_sse(response: aiohttp.ClientResponse) -> AsyncIterator[SseEvent]:
    """The events of an SSE response until the server closes it."""
    parser = SseParser()
    while raw := await response.content.readline():
        event = parser.feed(raw)
        if event is not None:
            yield event


async def iter_sse_idle(response: aiohttp.ClientResponse, idle_s: float) -> \
        AsyncIterator[SseEvent | None]:
    """The events of an SSE response, and None whenever no line came for `idle_s`,
    so the caller can look at the clock and its own state."""
    parser = SseParser()
    while True:
        try:
            raw = await asyncio.wait_for(response.content.readline(), idle_s)
        except TimeoutError:
            yield None
            continue
        if not raw:
            return
        event = parser.feed(raw)
        if event is not None:
            yield event


def until_done(events: list[SseEvent]) -> bool:
    """True once the last event is a run's `done`."""
    return bool(events) and events[-1].event == "done"


async def read_sse(session: aiohttp.ClientSession, url: str, *,
                   headers: dict[str, str] | None = None,
                   until: Callable[[list[SseEvent]], bool] = until_done, limit: int | None = None,
                   opened: asyncio.Event | None = None) -> list[SseEvent]:
    """Events until `until(events)` holds, `limit` events, or the server closes.

    No deadline: a stream is read for as long as it takes on a busy machine (a test
    that hangs is ended by pytest-timeout's per-test limit, with its traceback)."""
    events: list[SseEvent] = []
    async with session.get(url, headers=headers) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        if opened is not None:
            opened.set()
        async for event in iter_sse(response):
            events.append(event)
            if (limit is not None and len(events) >= limit) or until(events):
                break
    return events


async def until_opened(opened: asyncio.Event, reader: asyncio.Future[Any]) -> None:
    """Wait until `reader` (a task reading a stream) has opened it and set `opened`.

    No deadline, and no waiting forever either: a reader that ends first (refused,
    broken off, a failed assertion) fails the wait at once with how it ended."""
    waiting = asyncio.ensure_future(opened.wait())
    try:
        await asyncio.wait({waiting, reader}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    if opened.is_set():
        return
    error = reader.exception()
    if error is not None:
        raise AssertionError(f"the stream ended before it opened: {error!r}") from error
    raise AssertionError(f"the stream ended before it opened, with {reader.result()!r}")
