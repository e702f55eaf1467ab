"""Thread copies (issue #30) against the real stack: the official `langgraph-sdk`'s
`threads.copy`, then a run from an earlier checkpoint of the copy, and the native
`POST /v1/threads/{id}/copy`. Each branch of the copy reads as the source's, natively
(GET /v1/threads/{id}/messages?branch=) and through get_state / get_history."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.conftest import AUTH_B, Stack
from tests.gateway.test_langgraph_checkpoints import _client, _ids, _input, _lg, _native, _two_turns

pytestmark = pytest.mark.kafka


async def _branches(stack: Stack, thread_id: str) -> dict[str, Any]:
    status, body = await stack.get(f"/v1/threads/{thread_id}/branches")
    assert status == 200, body
    return {"current": body["current"], "branches": body["branches"]}


async def test_threads_copy_holds_every_branch_and_forks_on_its_own(stack: Stack) -> None:
    """threads.copy of a thread with two branches: a new thread whose state, history
    and every branch are the source's; a run from an earlier checkpoint of the copy
    forks the copy and leaves the source as it was."""
    client = _client(stack)
    thread_id = await _two_turns(stack, client)
    await client.runs.wait(thread_id, "agent", input=_input("second, edited"), checkpoint_id="2")
    source_state = await client.threads.get_state(thread_id)
    source_history = await client.threads.get_history(thread_id)
    source_branches = await _branches(stack, thread_id)
    assert len(source_branches["branches"]) == 2

    copy = await client.threads.copy(thread_id)
    copy_id = copy["thread_id"]
    assert copy_id != thread_id and copy["status"] == "idle"
    assert _lg(copy) == _lg(source_state)  # its values came with the answer
    assert _lg(await client.threads.get_state(copy_id)) == _lg(source_state)
    history = await client.threads.get_history(copy_id)
    assert _ids(history) == _ids(source_history)
    assert [_lg(s) for s in history] == [_lg(s) for s in source_history]
    assert await _branches(stack, copy_id) == source_branches
    for branch in source_branches["branches"]:
        assert await _native(stack, copy_id, branch["branch"]) == \
            await _native(stack, thread_id, branch["branch"])
    source_messages = await _native(stack, thread_id)

    await client.runs.wait(copy_id, "agent", input=_input("first, edited in the copy"),
                           checkpoint_id="0")
    forked = await _native(stack, copy_id)
    assert [(m[0], m[2]) for m in forked][:1] == [("human", "first, edited in the copy")]
    assert len(forked) == 2 and forked[1][0] == "ai"
    assert _lg(await client.threads.get_state(copy_id)) == forked
    assert len((await _branches(stack, copy_id))["branches"]) == 3
    assert await _native(stack, thread_id) == source_messages  # the source is as it was
    assert await _branches(stack, thread_id) == source_branches


async def test_the_native_copy_and_its_refusals(stack: Stack) -> None:
    """POST /v1/threads/{id}/copy answers 201 with the new thread (copied_from, the
    same message count and branch); another tenant's thread, or none, is a 404."""
    client = _client(stack)
    thread_id = await _two_turns(stack, client)
    status, body = await stack.call(f"/v1/threads/{thread_id}/copy", {"title": "a copy"})
    assert status == 201, body
    assert (body["status"], body["copied_from"], body["title"], body["message_count"]) == \
        ("copied", thread_id, "a copy", 4)
    assert await _native(stack, body["thread_id"]) == await _native(stack, thread_id)
    status, posted = await stack.post(body["thread_id"], "third, on the copy")
    assert status == 202, posted

    status, problem = await stack.call(f"/v1/threads/{thread_id}/copy", auth=AUTH_B)
    assert status == 404, problem
    status, problem = await stack.call("/v1/threads/00000000-0000-0000-0000-000000000000/copy")
    assert status == 404, problem
    status, problem = await stack.call(f"/v1/threads/{thread_id}/copy", {"title": "x" * 501})
    assert status == 422 and problem["type"].endswith("invalid-body"), problem
