"""A long conversation end to end over HTTP: 100 turns on one thread, each answered
by the worker, the whole history paged back in order, no role restarted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.gateway.conftest import Stack

pytestmark = pytest.mark.kafka

TURNS = 100


async def _until_ended(stack: Stack, thread_id: str, run_id: str) -> dict[str, Any]:
    """The thread once `run_id` has ended (its last_run), polled as a client would."""
    while True:
        status, body = await stack.get(f"/v1/threads/{thread_id}")
        assert status == 200, body
        last = body.get("last_run")
        if body["active_run"] is None and last is not None and last["run_id"] == run_id:
            return body  # type: ignore[no-any-return]
        await asyncio.sleep(0.05)


@pytest.mark.timeout(600)
async def test_one_hundred_turns_over_http(stack: Stack) -> None:
    """A hundred turns over HTTP complete, and the full history pages back in order."""
    thread_id = await stack.create_thread(title="long over http")
    runs = []
    for turn in range(TURNS):
        status, body = await stack.post(thread_id, f"turn {turn}: tell me more")
        assert status == 202 and body["status"] == "accepted", body
        runs.append(body["run_id"])
        thread = await _until_ended(stack, thread_id, body["run_id"])
        assert thread["last_run"]["status"] == "completed", (thread, stack.logs())
    assert (thread["message_count"], thread["run_count"]) == (2 * TURNS, TURNS)

    messages: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = "?limit=37" + (f"&after={cursor}" if cursor else "")
        status, page = await stack.get(f"/v1/threads/{thread_id}/messages{query}")
        assert status == 200, page
        messages += page["messages"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [m["seq"] for m in messages] == list(range(2 * TURNS))
    assert [m["text"] for m in messages[::2]] == [f"turn {t}: tell me more" for t in range(TURNS)]
    assert [m["role"] for m in messages] == ["user", "assistant"] * TURNS
    assert [m["run_id"] for m in messages[1::2]] == runs
    assert all(m["text"] for m in messages[1::2])
    assert stack.processor.alive() and stack.worker.alive()
    assert stack.processor.tail(2000).count("processor ") == 1, "the processor restarted"
