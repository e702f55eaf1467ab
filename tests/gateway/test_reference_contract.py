"""The reference contract to the letter, driven by a client written from its text alone
(`tests/gateway/reference_client.py`): ids, fields, order, the resume (also across a
gateway killed with SIGKILL), `message_not_streaming`, and a worker killed mid-answer."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from streams.devtools.broker import free_port
from streams.testing.process import RoleProcess
from streams.testing.sse import until_opened
from streams.testing.stack import wait_healthy_async as wait_healthy
from tests.gateway.conftest import Stack
from tests.gateway.reference_client import Event, ReferenceClient, Screen

pytestmark = pytest.mark.kafka

ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)")
# The echo makes the answer as long as the question: about 60 tokens at the slow rate.
LONG = " ".join(f"word{n}" for n in range(50))


def _deltas(n: int) -> Callable[[list[Event]], bool]:
    """A stop condition: at least `n` text deltas received."""
    return lambda events: sum(e.name == "text_delta" for e in events) >= n


def _check_fields(events: list[Event]) -> None:
    for event in events:
        if event.data == "[DONE]":
            continue
        data = event.data
        if event.name == "message_not_streaming":
            assert data["id"] and data["seq"] and ISO_UTC.fullmatch(data["ts"]), data
            continue
        assert data["seq"] == event.sse_id, event
        assert data["id"] == data["message_id"], event
        stamp = datetime.fromisoformat(data["ts"].replace("Z", "+00:00"))
        assert ISO_UTC.fullmatch(data["ts"]) and stamp.utcoffset() is not None
        assert stamp.astimezone(UTC).utcoffset().total_seconds() == 0  # type: ignore[union-attr]
        if event.name == "text_delta":
            assert isinstance(data["part_id"], str) and isinstance(data["delta"], str)


def _check_order(events: list[Event]) -> None:
    """message_start -> text_start -> text_delta* -> text_end -> citations? ->
    message_end -> done; step anywhere; unknown names ignored."""
    known = {"message_start": "S", "text_start": "T", "text_delta": "d", "text_end": "E",
             "citations": "C", "message_end": "M"}
    shape = "".join(known.get(e.name, "") for e in events if e.data != "[DONE]")
    assert re.fullmatch(r"(ST(d*)E)+C?M", shape), shape
    assert events[-1].data == "[DONE]" and events[-1].name == "done"


async def _stored_answer(client: ReferenceClient, thread_id: str, message_id: str) -> str:
    messages = await client.messages(thread_id)
    return str(next(m["text"] for m in messages if m["message_id"] == message_id))


async def test_the_reference_contract_point_by_point(stack: Stack) -> None:
    """Creation, fields, order, exact resume with last_message_id/last_entry_id, the
    message_not_streaming answer after the message ended, and [DONE]."""
    client = ReferenceClient(stack.session, stack.url("/"), "key-a")
    created = await client.create_thread("reference")
    thread_id = created["id"]
    assert created["thread_id"] == thread_id  # the alias stays
    opened = asyncio.Event()
    whole_task = asyncio.create_task(client.stream(thread_id, opened=opened))
    await until_opened(opened, whole_task)
    posted = await client.post(thread_id, f"[slow] {LONG}")
    assert posted["workflow_id"] == f"agent-{thread_id}"
    first = await client.stream(thread_id, stop=_deltas(3))
    rest = await client.stream(thread_id, last=first[-1])
    whole = await whole_task
    assert first + rest == whole  # no gap, no repeat
    _check_fields(whole)
    _check_order(whole)
    screen = Screen()
    for event in whole:
        screen.apply(event)
    answer_id = first[-1].data["id"]
    assert screen.text[answer_id] == await _stored_answer(client, thread_id, answer_id)

    # The message ended: the same reconnect says so, and REST has the message.
    again = await client.stream(thread_id, last=first[-1])
    assert [e.name for e in again] == ["message_not_streaming"]
    assert again[0].data["id"] == answer_id and again[0].data["seq"] == first[-1].data["seq"]
    _check_fields(again)


async def test_resume_after_the_gateway_is_killed_mid_answer(stack: Stack,
                                                              tmp_path: Path) -> None:
    """A gateway process killed with SIGKILL mid-answer: the reconnect to its
    restarted self gives exactly the missed events."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**stack.env, "THREADLINE_HTTP_PORT": str(port)}
    gateway = RoleProcess("gateway", env, tmp_path / "gateway.log").start()
    try:
        await wait_healthy(stack.session, f"{base}/healthz", timeout=60)
        client = ReferenceClient(stack.session, base, "key-a")
        watcher = ReferenceClient(stack.session, stack.url("/"), "key-a")  # never killed
        thread_id = (await client.create_thread("kill the gateway"))["id"]
        opened = asyncio.Event()
        whole_task = asyncio.create_task(watcher.stream(thread_id, opened=opened))
        await until_opened(opened, whole_task)
        # [hang]: a few tokens, then the run stays active until it is cancelled.
        posted = await client.post(thread_id, "[hang] survive a kill -9")
        first = await client.stream(thread_id, stop=_deltas(1))
        gateway.kill9()
        gateway = RoleProcess("gateway", env, tmp_path / "gateway2.log").start()
        await wait_healthy(stack.session, f"{base}/healthz", timeout=60)
        resumed_open = asyncio.Event()
        resumed_task = asyncio.create_task(
            client.stream(thread_id, last=first[-1], opened=resumed_open))
        await until_opened(resumed_open, resumed_task)
        async with stack.session.post(
                f"{base}/v1/threads/{thread_id}/runs/{posted['run_id']}/cancel",
                headers=client.headers) as response:
            assert response.status == 202, await response.text()
        whole = await whole_task
        resumed = await resumed_task
        assert first + resumed == whole, gateway.tail()
        assert whole[-2].name == "run_cancelled"
        _check_fields(whole)
    finally:
        gateway.stop()


async def test_a_worker_killed_mid_answer_ends_with_the_stored_answer(stack: Stack) -> None:
    """The worker is killed with SIGKILL mid-answer; the next execution restarts the
    message (`message_start`), and the client's screen ends with exactly the stored text."""
    client = ReferenceClient(stack.session, stack.url("/"), "key-a")
    thread_id = (await client.create_thread("kill the worker"))["id"]
    await client.post(thread_id, f"[slow] {LONG}")
    first = await client.stream(thread_id, stop=_deltas(2))
    stack.worker.kill9()
    stack.worker.start()
    rest = await client.stream(thread_id, last=first[-1])
    events = first + rest
    assert sum(e.name == "message_start" for e in events) >= 2, [e.name for e in events]
    screen = Screen()
    for event in events:
        screen.apply(event)
    answer_id = first[-1].data["id"]
    assert screen.text[answer_id] == await _stored_answer(client, thread_id, answer_id)
    assert events[-1].data == "[DONE]"
    _check_fields(events)
