"""A regenerate sent while a run is active, under each multitask strategy, over the
native API against the real processor and worker (issue #30, docs/branches.md's
table): reject is 409; enqueue waits for the run to end; interrupt cancels it and
keeps its question on the old branch; rollback removes its question; and a
regenerate of the message whose own run is active is 409 under every strategy."""

from __future__ import annotations

from typing import Any

import pytest

from streams.testing.sse import read_sse
from tests.gateway.conftest import AUTH_A, Stack

pytestmark = pytest.mark.kafka


async def _end(stack: Stack, run_id: str) -> tuple[str, str]:
    """The run's terminal event and detail; ("gone", "") once no record names it."""
    try:
        events = await read_sse(stack.session, stack.url(f"/v1/runs/{run_id}/events"),
                                headers=AUTH_A)
    except AssertionError as exc:  # read_sse asserts a 200
        if "no such run" not in str(exc):
            raise
        return "gone", ""
    assert events[-1].event == "done", [e.event for e in events]
    return events[-2].event, str(events[-2].json.get("detail", ""))


async def _texts(stack: Stack, thread_id: str, branch: int | None = None) -> \
        list[tuple[str, str]]:
    query = "" if branch is None else f"?branch={branch}"
    status, body = await stack.get(f"/v1/threads/{thread_id}/messages{query}")
    assert status == 200, body
    return [(m["role"], m["text"] if m["role"] == "user" else m["run_id"])
            for m in body["messages"] if not m.get("partial")]


async def _hung_behind_an_answer(stack: Stack) -> tuple[str, dict[str, Any], str]:
    """A thread whose first question is answered and whose second one's run hangs
    (active until cancelled): its id, the first question's JSON, the hung run."""
    thread_id = await stack.create_thread()
    status, first = await stack.post(thread_id, "first")
    assert status == 202, first
    assert (await _end(stack, first["run_id"]))[0] == "run_completed", stack.logs()
    status, body = await stack.get(f"/v1/threads/{thread_id}/messages")
    question = body["messages"][0]
    status, hung = await stack.post(thread_id, "[hang] second")
    assert status == 202, hung
    return thread_id, question, hung["run_id"]


def _regenerate_path(thread_id: str, message_id: str) -> str:
    return f"/v1/threads/{thread_id}/messages/{message_id}/regenerate"


async def _cancel(stack: Stack, thread_id: str, run_id: str) -> None:
    status, body = await stack.call(f"/v1/threads/{thread_id}/runs/{run_id}/cancel")
    assert status == 202, body


async def test_reject_refuses_a_regenerate_while_a_run_is_active(stack: Stack) -> None:
    """reject (the default): 409 naming the active run; nothing changes."""
    thread_id, question, hung = await _hung_behind_an_answer(stack)
    for body in ({}, {"multitask_strategy": "reject"}):
        status, problem = await stack.call(_regenerate_path(thread_id, question["message_id"]),
                                           body, key="r1")
        assert status == 409 and problem["active_run_id"] == hung, problem
    await _cancel(stack, thread_id, hung)
    status, listed = await stack.get(f"/v1/threads/{thread_id}/branches")
    assert len(listed["branches"]) == 1, listed


async def test_enqueue_regenerates_once_the_active_run_has_ended(stack: Stack) -> None:
    """enqueue: 202 at once; the active run goes on to its end on the old branch, then
    the regenerate's run answers on the new one."""
    thread_id, question, hung = await _hung_behind_an_answer(stack)
    status, queued = await stack.call(_regenerate_path(thread_id, question["message_id"]),
                                      {"multitask_strategy": "enqueue"}, key="r1")
    assert status == 202 and queued["status"] == "accepted", queued
    await _cancel(stack, thread_id, hung)  # its end lets the queued regenerate run
    assert (await _end(stack, queued["run_id"]))[0] == "run_completed", stack.logs()
    assert await _texts(stack, thread_id) == [("user", "first"), ("assistant", queued["run_id"])]
    status, listed = await stack.get(f"/v1/threads/{thread_id}/branches")
    [_, old] = listed["branches"]
    assert [t for t in await _texts(stack, thread_id, old["branch"]) if t[0] == "user"] == [
        ("user", "first"), ("user", "[hang] second")]


@pytest.mark.parametrize(("strategy", "detail"), [("interrupt", "interrupted"),
                                                  ("rollback", "rolled_back")])
async def test_interrupt_and_rollback_cancel_the_run_and_regenerate(
        stack: Stack, strategy: str, detail: str) -> None:
    """interrupt: the active run is cancelled, its question kept on the old branch;
    rollback: its question is removed. Either way the new answer is current."""
    thread_id, question, hung = await _hung_behind_an_answer(stack)
    status, regenerated = await stack.call(
        _regenerate_path(thread_id, question["message_id"]), {"multitask_strategy": strategy}, key="r1")
    assert status == 202, regenerated
    ended = await _end(stack, hung)
    assert ended == ("run_cancelled", detail) or (strategy == "rollback" and ended[0] == "gone")
    assert (await _end(stack, regenerated["run_id"]))[0] == "run_completed", stack.logs()
    assert await _texts(stack, thread_id) == [
        ("user", "first"), ("assistant", regenerated["run_id"])]
    status, listed = await stack.get(f"/v1/threads/{thread_id}/branches")
    [_, old] = listed["branches"]
    kept = [("user", "[hang] second")] if strategy == "interrupt" else []
    assert [t for t in await _texts(stack, thread_id, old["branch"]) if t[0] == "user"] == [
        ("user", "first"), *kept]


async def test_a_regenerate_of_the_active_runs_own_message_is_409_under_every_strategy(
        stack: Stack) -> None:
    """Its answer is still being made: cancel it first, or regenerate once it ended."""
    thread_id, _, hung = await _hung_behind_an_answer(stack)
    status, body = await stack.get(f"/v1/threads/{thread_id}/messages")
    second = next(m for m in body["messages"] if m["run_id"] == hung)
    for strategy in ("reject", "enqueue", "interrupt", "rollback"):
        status, problem = await stack.call(_regenerate_path(thread_id, second["message_id"]),
                                           {"multitask_strategy": strategy}, key=f"own-{strategy}")
        assert status == 409, (strategy, problem)
    await _cancel(stack, thread_id, hung)


async def test_an_edit_follows_the_strategy_too(stack: Stack) -> None:
    """reject: 409; enqueue: the edited question is stored at once off the current
    branch and runs once the active run has ended, its branch then current."""
    thread_id, question, hung = await _hung_behind_an_answer(stack)
    path = f"/v1/threads/{thread_id}/messages/{question['message_id']}/edit"
    status, problem = await stack.call(path, {"input_text": "first, edited"}, key="e1")
    assert status == 409 and problem["active_run_id"] == hung, problem
    status, queued = await stack.call(path, {"input_text": "first, edited",
                                             "multitask_strategy": "enqueue"}, key="e2")
    assert status == 202 and queued["status"] == "accepted", queued
    await _cancel(stack, thread_id, hung)
    assert (await _end(stack, queued["run_id"]))[0] == "run_completed", stack.logs()
    assert await _texts(stack, thread_id) == [
        ("user", "first, edited"), ("assistant", queued["run_id"])]
