"""A run through HTTP alone: create, stream, post, every event in order, stored answer."""

from __future__ import annotations

import asyncio

import pytest

from gateway.kafka import partition_for
from gateway.keys import FEED
from streams.agents.builtin import reply_for
from streams.testing.sse import SseEvent as Ev
from streams.testing.sse import read_sse, until_opened
from tests.gateway.conftest import AUTH_A, Stack

pytestmark = pytest.mark.kafka


def _kinds(events: list[Ev]) -> list[str]:
    return [e.event for e in events]


async def test_full_lifecycle_through_http(stack: Stack) -> None:
    """Over HTTP: create a thread, watch its stream, post, and see the run's events and stored answer."""
    thread_id = await stack.create_thread(title="lifecycle")
    status, thread = await stack.get(f"/v1/threads/{thread_id}")
    assert status == 200 and thread["title"] == "lifecycle" and thread["active_run"] is None

    opened = asyncio.Event()
    reader = asyncio.create_task(read_sse(
        stack.session, stack.url(f"/v1/threads/{thread_id}/stream"), headers=AUTH_A,
        opened=opened))
    await until_opened(opened, reader)
    status, posted = await stack.post(thread_id, "hello gateway")
    assert status == 202, posted
    assert posted["workflow_id"] == f"agent-{thread_id}" and posted["status"] == "accepted"
    events = await reader

    kinds = _kinds(events)
    assert kinds[:4] == ["run_accepted", "attempt_dispatched", "message_start", "text_start"], \
        (kinds, stack.logs())
    assert kinds[-4:] == ["text_end", "message_end", "run_completed", "done"], kinds
    assert set(kinds[4:-4]) == {"text_delta"}
    assert events[-1].data == "[DONE]"
    assert all(e.id for e in events) and len({e.id for e in events}) == len(events)
    tokens = stack.server.app[FEED].tokens
    partitions = {tokens.verify(e.id or "", thread_id).partition for e in events}
    assert partitions == {partition_for(thread_id, stack.settings.partitions)}
    datas = [e.json for e in events[:-1]]
    assert {d["run_id"] for d in datas} == {posted["run_id"]}
    assert datas[0]["user_message_id"] == posted["message_id"]
    streamed = "".join(d["delta"] for d in datas if "delta" in d)
    expected = reply_for("hello gateway", 12)
    assert streamed == expected
    assert datas[-1]["message"]["text"] == expected

    status, body = await stack.get(f"/v1/threads/{thread_id}/messages")
    assert status == 200
    assert [(m["role"], m["text"]) for m in body["messages"]] == [
        ("user", "hello gateway"), ("assistant", streamed)]
    assert body["messages"][1]["message_id"] == datas[-1]["message"]["message_id"]
    assert body["messages"][1]["run_id"] == posted["run_id"]

    # The run's own stream replays it from its start and closes after done.
    run_events = await read_sse(stack.session, stack.url(f"/v1/runs/{posted['run_id']}/events"),
                                headers=AUTH_A, until=lambda _: False)
    assert run_events == events
    # The reference API's last_message_id alone: the stream starts as a fresh one would.
    by_message = await read_sse(
        stack.session, stack.url(f"/v1/runs/{posted['run_id']}/events"
                                 f"?last_message_id={posted['message_id']}"),
        headers=AUTH_A, until=lambda _: False)
    assert by_message == events


async def test_streams_send_a_retry_hint_and_keep_alive_comments(stack: Stack) -> None:
    """A stream opens with a retry hint and then sends keep-alive comments while idle."""
    thread_id = await stack.create_thread()
    async with stack.session.get(stack.url(f"/v1/threads/{thread_id}/stream"),
                                 headers=AUTH_A) as response:
        assert response.status == 200
        assert response.headers["Cache-Control"] == "no-cache"
        first = await response.content.readline()
        assert first == b"retry: 2000\n"
        lines = [await response.content.readline() for _ in range(2)]
        assert b": keep-alive\n" in lines  # Options(keepalive_s=1) in the test stack
