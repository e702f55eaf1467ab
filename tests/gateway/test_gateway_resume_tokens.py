"""Resume tokens a client cannot forge, and replays whose cost is capped (issue 12)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from gateway.app import Options, create_app
from gateway.kafka import partition_for
from streams.config import Settings
from streams.testing.sse import SseEvent as Ev
from streams.testing.sse import read_sse, until_opened
from tests.gateway.conftest import AUTH_A, Stack

pytestmark = pytest.mark.kafka


@asynccontextmanager
async def _gateway(settings: Settings, options: Options) -> AsyncIterator[TestServer]:
    server = TestServer(create_app(settings, options), host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


def _fields(token: str) -> list[str]:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode().split(".")


def _token(fields: list[str]) -> str:
    return base64.urlsafe_b64encode(".".join(fields).encode()).decode().rstrip("=")


def _with(token: str, index: int, value: str) -> str:
    fields = _fields(token)
    fields[index] = value
    return _token(fields)


async def _a_run(stack: Stack, thread_id: str, text: str = "hello tokens") -> \
        tuple[str, list[Ev]]:
    opened = asyncio.Event()
    reader = asyncio.create_task(read_sse(
        stack.session, stack.url(f"/v1/threads/{thread_id}/stream"), headers=AUTH_A,
        opened=opened))
    await until_opened(opened, reader)
    status, posted = await stack.post(thread_id, text)
    assert status == 202, posted
    events = await reader
    assert len(events) > 8 and events[-1].event == "done", events
    return str(posted["run_id"]), events


async def _status(stack: Stack, path: str, token: str, how: str) -> tuple[int, Any]:
    headers = {**AUTH_A, "Last-Event-ID": token} if how == "header" else AUTH_A
    url = stack.url(path if how == "header" else f"{path}?last_event_id={token}")
    async with stack.session.get(url, headers=headers) as response:
        if response.status == 200:
            return 200, None
        return response.status, await response.json(content_type=None)


async def test_forged_or_borrowed_resume_tokens_get_400(stack: Stack) -> None:
    """Altered resume tokens, or ones from another thread, get 400."""
    other = await stack.create_thread()
    _, elsewhere = await _a_run(stack, other)
    partition = partition_for(other, stack.settings.partitions)
    thread_id = await stack.create_thread()  # another thread of the same partition
    while partition_for(thread_id, stack.settings.partitions) != partition:
        thread_id = await stack.create_thread()
    run_id, events = await _a_run(stack, thread_id)
    genuine = events[4].id or ""
    offset, run_start = int(_fields(genuine)[2]), int(_fields(genuine)[4])
    assert run_start > 0  # the other thread's run came first
    forged = {
        "run start 0": _with(genuine, 4, "0"),  # scan the whole partition
        "an earlier offset": _with(genuine, 2, str(offset - 1)),
        "another sub": _with(genuine, 3, "1"),
        "another thread's token": elsewhere[4].id or "",
    }
    paths = [f"/v1/threads/{thread_id}/stream", f"/v1/runs/{run_id}/events"]
    for what, token in forged.items():
        for path in paths:
            for how in ("header", "query"):
                status, problem = await _status(stack, path, token, how)
                assert status == 400, (what, path, how, status)
                assert problem["type"].endswith("/bad-last-event-id"), problem
    for path in paths:  # the genuine token still resumes, either way
        assert (await _status(stack, path, genuine, "header"))[0] == 200
        assert (await _status(stack, path, genuine, "query"))[0] == 200


async def test_a_replay_longer_than_the_cap_is_not_streamed(stack: Stack) -> None:
    """A resume needing more replayed records than the cap gets message_not_streaming instead."""
    capped = Settings.from_env({**stack.env, "THREADLINE_REPLAY_MAX_RECORDS": "4"})
    # Sees the run as it happens but keeps 3 events a thread: older ones need Kafka.
    async with _gateway(capped, Options(window_events=3, keepalive_s=1)) as gateway:
        thread_id = await stack.create_thread()
        run_id, events = await _a_run(stack, thread_id, "[slow] a run longer than the cap")
        base = str(gateway.make_url(""))
        # After the second event: a replay from the run's start, longer than 4 records.
        replayed = await read_sse(stack.session, f"{base}/v1/runs/{run_id}/events",
                                  headers={**AUTH_A, "Last-Event-ID": events[1].id or ""},
                                  until=lambda _: False)
        assert [e.event for e in replayed] == ["message_not_streaming"], replayed
        assert replayed[0].json["run_id"] == run_id
        # The window's last events need no replay.
        tail = await read_sse(stack.session, f"{base}/v1/runs/{run_id}/events",
                              headers={**AUTH_A, "Last-Event-ID": events[-2].id or ""},
                              until=lambda _: False)
        assert tail == events[-1:]


async def test_a_replay_decodes_large_batches_off_the_event_loop(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay decodes its large batches in a worker thread, not on the event loop."""
    from gateway.live import replay as replay_module  # here: the test then fails, not the import

    threads: list[str] = []
    to_thread = asyncio.to_thread

    async def recording(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        threads.append(getattr(func, "__qualname__", repr(func)))
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(replay_module, "INLINE_DECODE", 4, raising=False)  # "large": > 4 records
    monkeypatch.setattr(asyncio, "to_thread", recording)
    thread_id = await stack.create_thread()
    run_id, events = await _a_run(stack, thread_id)
    async with _gateway(stack.settings, Options(keepalive_s=1)) as cold:  # all from Kafka
        replayed = await read_sse(stack.session, str(cold.make_url(f"/v1/runs/{run_id}/events")),
                                  headers={**AUTH_A, "Last-Event-ID": events[0].id or ""},
                                  until=lambda _: False)
    assert replayed == events[1:]
    assert "_Replayer.events" in threads, threads
