"""The HTTP side of the chaos clients: requests that fail over between gateways,
and the SSE events as the audit records them."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from chaos.audit import Seen
from chaos.stack import API_KEY
from streams.testing.sse import iter_sse as iter_sse_kit
from streams.testing.sse import iter_sse_idle

__all__ = ["AUTH", "IDLE", "Api", "GaveUp", "iter_sse"]

AUTH = {"Authorization": f"Bearer {API_KEY}"}
REQUEST_TIMEOUT_S = 15.0


class GaveUp(Exception):
    """A request found no gateway that answered before its deadline."""


IDLE = Seen("", "", "")  # yielded after `idle_s` without a complete event


async def iter_sse(response: aiohttp.ClientResponse, idle_s: float | None = None) -> \
        AsyncIterator[Seen]:
    """The events of an SSE response (the testing kit's parser); with `idle_s`, also
    `IDLE` whenever no line came for that long, so the caller can look at the clock
    and its own state."""
    events = iter_sse_idle(response, idle_s) if idle_s is not None else iter_sse_kit(response)
    async for event in events:
        yield IDLE if event is None else Seen(event.id or "", event.event, event.data)


class Api:
    """JSON requests to any gateway; a connection error, a timeout or a 502/503
    is retried (on a gateway picked at random) until the deadline."""

    def __init__(self, session: aiohttp.ClientSession, bases: list[str], rng: random.Random) -> None:
        self.session, self.bases, self.rng = session, bases, rng
        self.server_errors: list[str] = []

    def base(self) -> str:
        """A gateway's base URL, picked at random."""
        return self.rng.choice(self.bases)

    async def call(self, method: str, path: str, *, body: Any = None,
                   headers: dict[str, str] | None = None, deadline: float,
                   retry_statuses: frozenset[int] = frozenset({502, 503, 504})) -> \
            tuple[int, Any]:
        """A request to any gateway: its status and JSON body, retried on `retry_statuses` till `deadline`."""
        pause = 0.1
        while True:
            try:
                async with self.session.request(
                        method, self.base() + path, json=body, headers={**AUTH, **(headers or {})},
                        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as response:
                    text = await response.text()
                    payload = json.loads(text) if text else None
                    if response.status >= 500 and response.status not in (502, 503, 504):
                        self.server_errors.append(f"{method} {path}: {response.status} {text[:200]}")
                    if response.status not in retry_statuses:
                        return response.status, payload
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass
            if time.monotonic() + pause > deadline:
                raise GaveUp(f"{method} {path}")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
