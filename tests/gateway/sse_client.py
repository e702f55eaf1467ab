"""A small SSE client for tests: parses frames as a browser's EventSource would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True, slots=True)
class Ev:
    id: str | None
    event: str
    data: str

    @property
    def json(self) -> Any:
        return json.loads(self.data)


async def iter_sse(response: aiohttp.ClientResponse) -> AsyncIterator[Ev]:
    event_id: str | None = None
    data: list[str] = []
    name, has_data = "message", False
    while True:
        raw = await response.content.readline()
        if not raw:
            return
        line = raw.decode().rstrip("\r\n")
        if not line:
            if has_data:
                yield Ev(event_id, name, "\n".join(data))
            event_id, name, data, has_data = None, "message", [], False
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            event_id = value
        elif field == "event":
            name = value
        elif field == "data":
            data.append(value)
            has_data = True


def until_done(events: list[Ev]) -> bool:
    return bool(events) and events[-1].event == "done"


async def read_sse(session: aiohttp.ClientSession, url: str, *,
                   headers: dict[str, str] | None = None,
                   until: Callable[[list[Ev]], bool] = until_done, limit: int | None = None,
                   timeout: float = 30.0, opened: asyncio.Event | None = None) -> list[Ev]:
    """Events until `until(events)` holds, `limit` events, or the server closes."""
    events: list[Ev] = []

    async def read() -> None:
        async with session.get(url, headers=headers) as response:
            assert response.status == 200, await response.text()
            assert response.headers["Content-Type"].startswith("text/event-stream")
            if opened is not None:
                opened.set()
            async for event in iter_sse(response):
                events.append(event)
                if (limit is not None and len(events) >= limit) or until(events):
                    return

    await asyncio.wait_for(read(), timeout)
    return events


def _never(_: list[Ev]) -> bool:
    return False


async def check_every_resume(session: aiohttp.ClientSession, base: str, reference: list[Ev],
                             thread_id: str, run_id: str,
                             auth: dict[str, str] | None = None) -> None:
    """Resuming after each event of `reference`, on both endpoints, yields the rest of it."""
    auth = auth or {"Authorization": "Bearer key-a"}
    run_url = f"{base}/v1/runs/{run_id}/events"
    whole_run = await read_sse(session, run_url, headers=auth, until=_never)
    assert whole_run == reference, base
    for k, event in enumerate(reference):
        assert event.id
        if k < len(reference) - 1:
            rest = await read_sse(session, f"{base}/v1/threads/{thread_id}/stream",
                                  headers={**auth, "Last-Event-ID": event.id})
            assert reference[:k + 1] + rest == reference, (base, k)
        rest = await read_sse(session, f"{run_url}?last_event_id={event.id}", headers=auth,
                              until=_never)
        assert rest == reference[k + 1:], (base, k)
