"""A client written from the reference contract's text alone (docs/clients.md).

Only aiohttp and the contract: `POST /v1/threads` answers `id`; `user_message` answers
`workflow_id`; every event's data carries `id`, `seq` and `ts`; a reconnect passes
`last_message_id` and `last_entry_id` from the last event's data; `message_not_streaming`
means "fetch it over REST"; `data: [DONE]` ends the message. It does not import the
repository's SSE helpers on purpose: it is what an outside client would write.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass(frozen=True, slots=True)
class Event:
    """One SSE event as received: its `id:` line, name and data (JSON or `[DONE]`)."""

    sse_id: str | None
    name: str
    data: Any


@dataclass
class Screen:
    """What a chat UI shows of one assistant message, folded from events."""

    text: dict[str, str] = field(default_factory=dict)  # message id -> text so far

    def apply(self, event: Event) -> None:
        """Fold one event: a `message_start` starts (or restarts) its message's text."""
        if not isinstance(event.data, dict):
            return
        if event.name == "message_start":
            self.text[event.data["id"]] = ""  # a new attempt: drop the superseded text
        elif event.name == "text_delta":
            self.text[event.data["id"]] = self.text.get(event.data["id"], "") + \
                event.data["delta"]


class ReferenceClient:
    """The reference contract over HTTP, with one API key."""

    def __init__(self, session: aiohttp.ClientSession, base: str, key: str) -> None:
        self.session, self.base = session, base.rstrip("/")
        self.headers = {"Authorization": f"Bearer {key}"}

    async def create_thread(self, title: str) -> dict[str, Any]:
        """POST /v1/threads: 201 with `id`."""
        async with self.session.post(f"{self.base}/v1/threads", json={"title": title},
                                     headers=self.headers) as response:
            assert response.status == 201, await response.text()
            body: dict[str, Any] = await response.json()
            return body

    async def post(self, thread_id: str, text: str) -> dict[str, Any]:
        """POST /v1/threads/{id}/user_message: 202 with `workflow_id`."""
        async with self.session.post(f"{self.base}/v1/threads/{thread_id}/user_message",
                                     json={"input_text": text},
                                     headers=self.headers) as response:
            assert response.status == 202, await response.text()
            body: dict[str, Any] = await response.json()
            return body

    async def messages(self, thread_id: str) -> list[dict[str, Any]]:
        """GET /v1/threads/{id}/messages."""
        async with self.session.get(f"{self.base}/v1/threads/{thread_id}/messages",
                                    headers=self.headers) as response:
            assert response.status == 200, await response.text()
            body = await response.json()
            return list(body["messages"])

    async def stream(self, thread_id: str, *, last: Event | None = None,
                     stop: Callable[[list[Event]], bool] | None = None,
                     opened: asyncio.Event | None = None) -> list[Event]:
        """GET /v1/threads/{id}/stream until `[DONE]`, `message_not_streaming`, or
        `stop(events)`; resuming after `last` with its data's `id` and `seq`; `opened`
        is set once the stream's headers arrived."""
        params = {}
        if last is not None:
            params = {"last_message_id": last.data["id"], "last_entry_id": last.data["seq"]}
        events: list[Event] = []
        async with self.session.get(f"{self.base}/v1/threads/{thread_id}/stream",
                                    params=params, headers=self.headers) as response:
            assert response.status == 200, await response.text()
            if opened is not None:
                opened.set()
            sse_id, name, data = None, "message", []
            async for raw in response.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith(":"):
                    continue
                if line:
                    key, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if key == "id":
                        sse_id = value
                    elif key == "event":
                        name = value
                    elif key == "data":
                        data.append(value)
                    continue
                if not data:
                    sse_id, name = None, "message"
                    continue
                text = "\n".join(data)
                events.append(Event(sse_id, name, text if text == "[DONE]" else json.loads(text)))
                sse_id, name, data = None, "message", []
                if text == "[DONE]" or events[-1].name == "message_not_streaming" or \
                        (stop is not None and stop(events)):
                    return events
        return events
