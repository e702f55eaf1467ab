"""Two gateways of one deployment, as a load balancer without affinity uses them (part
of issue #26's contract, while every gateway still reads every partition): a thread
created through one is read through the other at once, and a run's stream read
through one resumes through the other from the first one's Last-Event-ID with no
gap and no repeat."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from streams.config import Settings
from streams.testing.sse import read_sse
from tests.gateway.conftest import AUTH_A, Stack, in_process_gateway

pytestmark = pytest.mark.kafka


@asynccontextmanager
async def _other_gateway(settings: Settings) -> AsyncIterator[str]:
    """A second gateway of the stack's deployment; its base URL."""
    async with in_process_gateway(settings) as (base, _):
        yield base.rstrip("/")


async def test_a_thread_made_through_one_gateway_is_read_through_another_at_once(
        stack: Stack) -> None:
    """Created through the first gateway, the thread (and then its run) is read through
    the second with no retry: the second catches up on the thread's partition first."""
    async with _other_gateway(stack.settings) as other:
        for n in range(5):  # each time, the first read of it on the other gateway
            thread_id = await stack.create_thread(title=f"across {n}")
            async with stack.session.get(f"{other}/v1/threads/{thread_id}",
                                         headers=AUTH_A) as response:
                body = await response.json()
                assert response.status == 200, body
                assert body["thread_id"] == thread_id and body["title"] == f"across {n}"
            status, posted = await stack.post(thread_id, f"hello across {n}")
            assert status == 202, posted
            events = await read_sse(stack.session, f"{other}/v1/runs/{posted['run_id']}/events",
                                    headers=AUTH_A)
            names = [e.event for e in events]
            assert names[0] == "run_accepted" and names[-2:] == ["run_completed", "done"], names


async def test_a_run_stream_resumes_through_another_gateway_with_no_gap_and_no_repeat(
        stack: Stack) -> None:
    """The event ids one gateway signs resume the stream on another: the events after
    the id are the same, id for id, as the first gateway sent after it."""
    thread_id = await stack.create_thread(title="resume across")
    status, posted = await stack.post(thread_id, "tell me something long")
    assert status == 202, posted
    path = f"/v1/runs/{posted['run_id']}/events"
    whole = await read_sse(stack.session, stack.url(path), headers=AUTH_A)
    ids = [e.id for e in whole if e.id]
    assert len(ids) >= 4, [e.event for e in whole]
    async with _other_gateway(stack.settings) as other:
        for cut in (1, len(ids) // 2, len(ids) - 1):
            resumed = await read_sse(stack.session, f"{other}{path}",
                                     headers={**AUTH_A, "Last-Event-ID": ids[cut - 1]})
            after = whole[[e.id for e in whole].index(ids[cut - 1]) + 1:]
            assert [(e.id, e.event, e.data) for e in resumed] == \
                [(e.id, e.event, e.data) for e in after]
