"""Double-texting over the native API against the real processor and worker: a
second message posted while the first one's run streams, with each strategy."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streams.testing.sse import iter_sse, read_sse
from tests.gateway.conftest import AUTH_A, Stack

pytestmark = pytest.mark.kafka


async def _post(stack: Stack, thread_id: str, text: str, strategy: str | None,
                key: str | None = None) -> tuple[int, dict[str, Any]]:
    body: dict[str, Any] = {"input_text": text}
    if strategy is not None:
        body["multitask_strategy"] = strategy
    return await stack.call(f"/v1/threads/{thread_id}/user_message", body, key=key)


async def _run_end(stack: Stack, run_id: str) -> tuple[str, str]:
    """The run's terminal event and its detail, read from its stream to `done`;
    ("gone", "") if the gateway no longer knows the run (a rolled-back run's user
    message, which names it, is tombstoned)."""
    try:
        events = await read_sse(stack.session, stack.url(f"/v1/runs/{run_id}/events"),
                                headers=AUTH_A)
    except AssertionError as exc:  # read_sse asserts a 200
        if "no such run" not in str(exc):
            raise
        return "gone", ""
    assert events[-1].event == "done", [e.event for e in events]
    return events[-2].event, str(events[-2].json.get("detail", ""))


async def _messages(stack: Stack, thread_id: str) -> list[tuple[str, str, str | None]]:
    """(role, run id, run status) of the stored messages, an interrupted run's partial
    answer left out (test_an_interrupted_runs_partial_answer_is_stored_marked has it)."""
    status, body = await stack.get(f"/v1/threads/{thread_id}/messages")
    assert status == 200, body
    return [(m["role"], m["run_id"], m.get("run_status")) for m in body["messages"]
            if not m.get("partial")]


async def test_enqueue_runs_the_second_message_after_the_first(stack: Stack) -> None:
    """enqueue: 202 at once, listed as queued, answered after the first run completes."""
    thread_id = await stack.create_thread()
    status, first = await _post(stack, thread_id, "[slow] first", None)
    assert status == 202, first
    status, second = await _post(stack, thread_id, "second", "enqueue", key="k2")
    assert status == 202 and second["status"] in ("accepted", "pending"), second
    status, again = await _post(stack, thread_id, "second", "enqueue", key="k2")
    assert status == 202 and again.get("replayed") is True, again  # queued once only
    listed = {run: status for role, run, status in await _messages(stack, thread_id)
              if role == "user"}
    # queued while the first run lasts (under load it may have ended already)
    assert listed.get(second["run_id"]) in ("queued", "dispatched", "running", "completed"), \
        listed
    assert await _run_end(stack, first["run_id"]) == ("run_completed", "")
    assert (await _run_end(stack, second["run_id"]))[0] == "run_completed", stack.logs()
    assert await _messages(stack, thread_id) == [
        ("user", first["run_id"], "completed"), ("user", second["run_id"], "completed"),
        ("assistant", first["run_id"], None), ("assistant", second["run_id"], None)]


@pytest.mark.parametrize(("strategy", "detail"), [("interrupt", "interrupted"),
                                                  ("rollback", "rolled_back")])
async def test_interrupt_and_rollback_cancel_the_first_run(stack: Stack, strategy: str,
                                                           detail: str) -> None:
    """The first run ends run_cancelled (detail says why), the second is answered; an
    interrupted question stays (cancelled), a rolled-back one is gone."""
    thread_id = await stack.create_thread()
    status, first = await _post(stack, thread_id, "[slow] first", None)
    assert status == 202, first
    status, second = await _post(stack, thread_id, "second", strategy, key="k2")
    assert status == 202, second
    ended = await _run_end(stack, first["run_id"])
    assert ended == ("run_cancelled", detail) or (strategy == "rollback" and ended[0] == "gone")
    assert (await _run_end(stack, second["run_id"]))[0] == "run_completed", stack.logs()
    status, again = await _post(stack, thread_id, "second", strategy, key="k2")
    assert status == 202 and again.get("replayed") is True, again  # no second cancel or run
    kept = [("user", first["run_id"], "cancelled")] if strategy == "interrupt" else []
    assert await _messages(stack, thread_id) == [
        *kept, ("user", second["run_id"], "completed"), ("assistant", second["run_id"], None)]


async def test_an_interrupted_runs_partial_answer_is_stored_marked(stack: Stack) -> None:
    """What the interrupted run had streamed is kept: its worker reports it when it
    stops, and the history stores it once, after the interrupting question, as an
    assistant message of the first run marked partial (run_status cancelled)."""
    thread_id = await stack.create_thread()
    status, first = await _post(stack, thread_id, "[slow] first " + "word " * 40, None)
    assert status == 202, first
    shown, second = "", None
    async with stack.session.get(stack.url(f"/v1/runs/{first['run_id']}/events"),
                                 headers=AUTH_A) as response:
        assert response.status == 200, await response.text()
        async for event in iter_sse(response):
            if event.event == "text_delta":
                shown += event.json["delta"]
                if second is None and len(shown) >= 10:  # a marker: the first run answers
                    status, second = await _post(stack, thread_id, "second", "interrupt")
                    assert status == 202, second
            if event.event == "run_cancelled":
                assert event.json["detail"] == "interrupted"
            if event.event == "done":
                break
    assert second is not None
    assert (await _run_end(stack, second["run_id"]))[0] == "run_completed"
    while True:  # the partial answer is stored after the worker stopped: wait for it
        status, body = await stack.get(f"/v1/threads/{thread_id}/messages")
        partials = [m for m in body["messages"] if m.get("partial")]
        if partials:
            break
        await asyncio.sleep(0.1)
    (partial,) = partials
    assert partial["role"] == "assistant" and partial["run_id"] == first["run_id"]
    assert partial["run_status"] == "cancelled"
    assert partial["text"].startswith(shown) and len(partial["text"]) >= 10, (partial, shown)
    assert [(m["role"], m["run_id"]) for m in body["messages"]][:2] == [
        ("user", first["run_id"]), ("user", second["run_id"])]


async def test_reject_is_the_default_and_an_unknown_strategy_is_422(stack: Stack) -> None:
    """Without a strategy (or with reject) a double text is 409; anything else 422."""
    thread_id = await stack.create_thread()
    # "[hang]", not "[slow]": a slow answer here is under a second, and on a loaded
    # machine the run ended before the second post was decided (202, not 409). A hung
    # run stays active until this test cancels it.
    status, first = await _post(stack, thread_id, "[hang] first", None)
    assert status == 202, first
    for strategy in (None, "reject"):
        status, body = await _post(stack, thread_id, "second", strategy)
        assert status == 409 and body["active_run_id"] == first["run_id"], body
    for bad in ("later", 3):
        async with stack.session.post(
                stack.url(f"/v1/threads/{thread_id}/user_message"),
                json={"input_text": "x", "multitask_strategy": bad}, headers=AUTH_A) as response:
            assert response.status == 422, await response.text()
    async with stack.session.post(
            stack.url(f"/v1/threads/{thread_id}/runs/{first['run_id']}/cancel"),
            headers=AUTH_A) as response:
        assert response.status == 202, await response.text()
    assert (await _run_end(stack, first["run_id"]))[0] == "run_cancelled"
