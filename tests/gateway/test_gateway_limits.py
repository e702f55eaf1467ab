"""Per-tenant limits against the real stack: each is refused with 429, Retry-After and
problem+json, and admits again once the tenant is back under it (issue 12)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from gateway.app import Options, create_app
from streams.config import Settings
from streams.testing.sse import read_sse, until_opened
from tests.gateway.conftest import KEYS, Stack

pytestmark = pytest.mark.kafka


@dataclass
class Limited:
    """A gateway of its own with small limits, and a tenant no other test uses."""

    server: TestServer
    stack: Stack
    tenant: str
    auth: dict[str, str]

    def url(self, path: str) -> str:
        """The URL of a path on this limited gateway."""
        return str(self.server.make_url(path))

    async def call(self, method: str, path: str, body: Any = None) -> \
            tuple[int, dict[str, str], Any]:
        """Send one request as the limited tenant; the status, headers and JSON body."""
        async with self.stack.session.request(method, self.url(path), json=body,
                                              headers=self.auth) as response:
            return response.status, dict(response.headers), \
                await response.json(content_type=None)

    async def thread(self) -> str:
        """Create a thread as the limited tenant and return its id."""
        status, _, body = await self.call("POST", "/v1/threads", {"title": "limits"})
        assert status == 201, body
        return str(body["thread_id"])

    async def until_active_run(self, thread_id: str, active: bool) -> None:
        """The marker: the gateway's read model shows the thread's run (not) in progress."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, _, body = await self.call("GET", f"/v1/threads/{thread_id}")
            assert status == 200, body
            if (body["active_run"] is not None) == active:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"thread {thread_id} never had active_run={active}")


@asynccontextmanager
async def _limited(stack: Stack, options: Options | None = None, **env: str) -> \
        AsyncIterator[Limited]:
    tenant, key = f"limited-{uuid.uuid4().hex[:8]}", f"key-{uuid.uuid4().hex}"
    keys = ",".join(f"{k}={t}" for k, t in {**KEYS, key: tenant}.items())
    settings = Settings.from_env({**stack.env, "THREADLINE_API_KEYS": keys, **env})
    server = TestServer(create_app(settings, options or Options(keepalive_s=0.2)),
                        host="127.0.0.1")
    await server.start_server()
    try:
        yield Limited(server, stack, tenant, {"Authorization": f"Bearer {key}"})
    finally:
        await server.close()


def _too_many(status: int, headers: dict[str, str], body: Any, slug: str) -> int:
    assert status == 429, body
    assert headers["Content-Type"].startswith("application/problem+json"), headers
    assert body["status"] == 429 and body["type"].endswith(slug), body
    return int(headers["Retry-After"])


async def test_posts_beyond_the_tenants_rate_get_429(stack: Stack) -> None:
    """Posts past a tenant's burst get 429 with Retry-After, while other tenants post on."""
    # Two at once, then one per 100 s: nothing refills while the test runs.
    async with _limited(stack, THREADLINE_TENANT_POSTS_PER_S="0.01",
                        THREADLINE_TENANT_POST_BURST="2") as gateway:
        thread_id = await gateway.thread()
        status, _, body = await gateway.call("POST", f"/v1/threads/{thread_id}/user_message",
                                             {"input_text": "hello"})
        assert status == 202, body
        for path, body in [("/v1/threads", {"title": "x"}),
                           (f"/v1/threads/{thread_id}/user_message", {"input_text": "again"})]:
            assert _too_many(*await gateway.call("POST", path, body), "/too-many-posts") == 100
        # Other tenants post on.
        status, _ = await stack.post(await stack.create_thread(), "tenant a is not limited")
        assert status == 202


async def test_streams_beyond_the_tenants_limit_get_429(stack: Stack) -> None:
    """A tenant's third open stream gets 429, and one is admitted again once a stream ends."""
    async with _limited(stack, THREADLINE_TENANT_MAX_STREAMS="2") as gateway:
        thread_id = await gateway.thread()
        path = f"/v1/threads/{thread_id}/stream"
        opened = [asyncio.Event(), asyncio.Event()]
        readers = [asyncio.create_task(read_sse(
            stack.session, gateway.url(path), headers=gateway.auth, opened=o,
            until=lambda _: False)) for o in opened]
        for o, reader in zip(opened, readers, strict=True):
            await until_opened(o, reader)
        async with stack.session.get(gateway.url(path), headers=gateway.auth) as response:
            assert response.status == 429, "a third stream was opened"
            body = await response.json(content_type=None)
            assert _too_many(429, dict(response.headers), body, "/too-many-streams") == 5
        readers[0].cancel()
        # The marker: a stream is admitted again once the gateway saw one end.
        deadline = time.monotonic() + 30
        while True:
            async with stack.session.get(gateway.url(path), headers=gateway.auth) as response:
                if response.status == 200:
                    break
                assert response.status == 429 and time.monotonic() < deadline
            await asyncio.sleep(0.05)
        readers[1].cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def test_replays_beyond_the_tenants_limit_get_429(stack: Stack) -> None:
    """A resume that needs a Kafka replay gets 429 while the tenant's replay slot is taken."""
    # Keeps 3 events a thread: resuming earlier in a run replays it from Kafka.
    async with _limited(stack, Options(window_events=3, keepalive_s=0.2),
                        THREADLINE_TENANT_MAX_REPLAYS="1") as gateway:
        thread_id = await gateway.thread()
        status, _, posted = await gateway.call("POST", f"/v1/threads/{thread_id}/user_message",
                                               {"input_text": "something to replay"})
        assert status == 202, posted
        run_url = gateway.url(f"/v1/runs/{posted['run_id']}/events")
        events = await read_sse(stack.session, run_url, headers=gateway.auth)
        early = {**gateway.auth, "Last-Event-ID": events[2].id or ""}
        late = {**gateway.auth, "Last-Event-ID": events[-2].id or ""}
        assert await read_sse(stack.session, run_url, headers=early,
                              until=lambda _: False) == events[3:]
        with _limiter(gateway.server).replay(gateway.tenant):  # one replay in progress
            async with stack.session.get(run_url, headers=early) as response:
                body = await response.json(content_type=None)
                assert _too_many(response.status, dict(response.headers), body,
                                 "/too-many-replays") == 1
            # From the window: no replay, no slot needed.
            assert await read_sse(stack.session, run_url, headers=late,
                                  until=lambda _: False) == events[-1:]
        assert await read_sse(stack.session, run_url, headers=early,
                              until=lambda _: False) == events[3:]


def _limiter(server: TestServer) -> Any:
    from gateway.keys import LIMITER  # here: the test then fails, not the module's import

    return server.app[LIMITER]


async def test_runs_beyond_the_tenants_active_run_cap_get_429(stack: Stack) -> None:
    """A run past the tenant's active-run cap gets 429 until a run ends; other tenants run on."""
    async with _limited(stack, THREADLINE_TENANT_MAX_ACTIVE_RUNS="1") as gateway:
        first, second = await gateway.thread(), await gateway.thread()
        status, _, hanging = await gateway.call("POST", f"/v1/threads/{first}/user_message",
                                                {"input_text": "[hang] hold the only slot"})
        assert status == 202 and hanging["status"] == "accepted", hanging
        await gateway.until_active_run(first, True)
        refused = await gateway.call("POST", f"/v1/threads/{second}/user_message",
                                     {"input_text": "a second run"})
        assert _too_many(*refused, "/too-many-active-runs") == 5
        # Another tenant is not held back by this one's runs.
        status, _ = await stack.post(await stack.create_thread(), "tenant a runs on")
        assert status == 202
        status, _, cancelled = await gateway.call(
            "POST", f"/v1/threads/{first}/runs/{hanging['run_id']}/cancel")
        assert status == 202, cancelled
        await gateway.until_active_run(first, False)
        status, _, body = await gateway.call("POST", f"/v1/threads/{second}/user_message",
                                             {"input_text": "now there is room"})
        assert status == 202, body
