"""Resuming SSE streams: no gap, no duplicate, from the window, from Kafka, across a
gateway process restart; and one shared feed for many clients."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import Options, create_app
from gateway.keys import FEED
from streams.devtools.broker import free_port
from streams.testing.process import RoleProcess
from streams.testing.sse import SseEvent as Ev
from streams.testing.sse import read_sse, until_opened
from streams.testing.stack import wait_healthy_async as wait_healthy
from tests.gateway.conftest import AUTH_A, Stack
from tests.gateway.sse_client import check_every_resume

pytestmark = pytest.mark.kafka


@asynccontextmanager
async def _gateway(stack: Stack, options: Options) -> AsyncIterator[TestServer]:
    server = TestServer(create_app(stack.settings, options), host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


async def _chain(session: aiohttp.ClientSession, url: str) -> list[Ev]:
    """Read one event per connection: cut after every event, resume with Last-Event-ID."""
    events: list[Ev] = []
    while not events or events[-1].event != "done":
        headers = dict(AUTH_A)
        if events:
            headers["Last-Event-ID"] = events[-1].id or ""
        events += await read_sse(session, url, headers=headers, limit=1)
    return events


async def test_reconnecting_after_every_event_gives_the_uninterrupted_stream(
        stack: Stack) -> None:
    """Reconnecting with Last-Event-ID after every event gives the same stream as never reconnecting."""
    session = stack.session
    # Sees the run as it happens, but keeps only 3 events a thread: resumes mix
    # Kafka and the window.
    async with _gateway(stack, Options(window_events=3, keepalive_s=1)) as tiny:
        thread_id = await stack.create_thread()
        url = stack.url(f"/v1/threads/{thread_id}/stream")
        opened = asyncio.Event()
        reference_task = asyncio.create_task(
            read_sse(session, url, headers=AUTH_A, opened=opened))
        await until_opened(opened, reference_task)
        chained_task = asyncio.create_task(_chain(session, url))
        status, posted = await stack.post(thread_id, "[slow] cut me anywhere")
        assert status == 202
        reference = await reference_task
        assert len(reference) > 10 and reference[-1].event == "done"
        assert await chained_task == reference

        await check_every_resume(session, str(stack.server.make_url("")), reference,
                                  thread_id, posted["run_id"])
        await check_every_resume(session, str(tiny.make_url("")), reference,
                                  thread_id, posted["run_id"])
        # Started after the run ended: everything it serves of this run comes from Kafka.
        async with _gateway(stack, Options(keepalive_s=1)) as cold:
            await check_every_resume(session, str(cold.make_url("")), reference,
                                      thread_id, posted["run_id"])


async def test_a_hundred_clients_on_one_thread_see_identical_streams(stack: Stack) -> None:
    """A hundred clients on one thread all receive the same events."""
    thread_id = await stack.create_thread()
    url = stack.url(f"/v1/threads/{thread_id}/stream")
    feed = stack.server.app[FEED]
    before = len(feed.subscribers)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        opened = [asyncio.Event() for _ in range(100)]
        readers = [asyncio.create_task(read_sse(session, url, headers=AUTH_A, opened=o))
                   for o in opened]
        for o, reader in zip(opened, readers, strict=True):
            await until_opened(o, reader)
        assert len(feed.subscribers) == before + 100
        status, _ = await stack.post(thread_id, "hello, everyone")
        assert status == 202
        streams = await asyncio.gather(*readers)
    assert len(streams[0]) > 10 and streams[0][-1].event == "done"
    assert all(s == streams[0] for s in streams)
    deadline = time.monotonic() + 10  # gone clients are noticed at the next keep-alive
    while len(feed.subscribers) > before and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert len(feed.subscribers) == before


async def test_resume_across_a_gateway_process_restart(stack: Stack, tmp_path: Path) -> None:
    """Streams resume across a gateway killed and restarted, and SIGTERM ends open streams cleanly."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**stack.env, "THREADLINE_HTTP_PORT": str(port)}
    gateway = RoleProcess("gateway", env, tmp_path / "gateway.log").start()
    try:
        await wait_healthy(stack.session, f"{base}/healthz", timeout=60)
        thread_id = await stack.create_thread()
        opened = asyncio.Event()
        reference_task = asyncio.create_task(read_sse(
            stack.session, stack.url(f"/v1/threads/{thread_id}/stream"), headers=AUTH_A,
            opened=opened))
        await until_opened(opened, reference_task)
        # [hang]: a few tokens, then the run stays active until it is cancelled.
        status, posted = await stack.post(thread_id, "[hang] survive a restart")
        assert status == 202
        run_id = posted["run_id"]
        first = await read_sse(stack.session, f"{base}/v1/threads/{thread_id}/stream",
                               headers=AUTH_A, until=lambda e: e[-1].event == "text_delta")
        assert [e.event for e in first[:3]] == ["run_accepted", "attempt_dispatched",
                                                "message_start"], gateway.tail()
        gateway.kill9()
        gateway = RoleProcess("gateway", env, tmp_path / "gateway2.log").start()
        await wait_healthy(stack.session, f"{base}/healthz", timeout=60)
        resumed_open, fresh_open = asyncio.Event(), asyncio.Event()
        resumed_task = asyncio.create_task(read_sse(
            stack.session, f"{base}/v1/threads/{thread_id}/stream",
            headers={**AUTH_A, "Last-Event-ID": first[-1].id or ""},
            opened=resumed_open))
        fresh_task = asyncio.create_task(read_sse(  # starts at the active run's start
            stack.session, f"{base}/v1/threads/{thread_id}/stream", headers=AUTH_A,
            opened=fresh_open))
        # Both streams are open before the cancel (not a half-second's sleep).
        await until_opened(resumed_open, resumed_task)
        await until_opened(fresh_open, fresh_task)
        async with stack.session.post(f"{base}/v1/threads/{thread_id}/runs/{run_id}/cancel",
                                      headers=AUTH_A) as response:
            assert response.status == 202, await response.text()
        reference = await reference_task
        assert reference[-2].event == "run_cancelled", reference
        assert first + await resumed_task == reference
        assert await fresh_task == reference
        await check_every_resume(stack.session, base, reference, thread_id, run_id)

        # The key in a query string never reaches the log.
        by_query = await read_sse(stack.session,
                                  f"{base}/v1/runs/{run_id}/events?access_token=key-a")
        assert by_query == reference
        # SIGTERM ends open streams at once instead of waiting for them.
        opened = asyncio.Event()
        open_stream = asyncio.create_task(read_sse(
            stack.session, f"{base}/v1/threads/{thread_id}/stream", headers=AUTH_A,
            opened=opened, until=lambda _: False))
        await until_opened(opened, open_stream)
        await asyncio.to_thread(gateway.stop)
        # Ended by the gateway, cleanly: a stream left open would have been cut when
        # the shutdown timeout cancelled its handler (a payload error here), not timed.
        await open_stream
        assert gateway.proc is not None and gateway.proc.returncode == 0, gateway.tail()
        log = (tmp_path / "gateway2.log").read_text()
        assert f"listening on http://127.0.0.1:{port}" in log
        assert "access_token=[redacted]" in log and "key-a" not in log
    finally:
        gateway.stop()
