"""The LangGraph runs API driven by the official `langgraph-sdk`, public API only,
against the real stack: threads, the assistant, runs.stream / wait / create / cancel,
join_stream across a gateway killed with SIGKILL, and a worker killed mid-answer."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError
from langgraph_sdk.schema import StreamPart

from gateway.adapters.langgraph import threads as langgraph_threads
from streams.devtools.broker import free_port
from streams.testing.process import RoleProcess
from streams.testing.stack import wait_healthy_async as wait_healthy
from tests.gateway.conftest import Stack

pytestmark = pytest.mark.kafka

LONG = " ".join(f"word{n}" for n in range(50))


def _client(base: str, key: str = "key-a") -> Any:
    return get_client(url=f"{base.rstrip('/')}/langgraph", api_key=key)


def _input(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def _stored(client: Any, thread_id: str) -> dict[str, Any]:
    state = await client.threads.get_state(thread_id)
    last: dict[str, Any] = state["values"]["messages"][-1]
    assert last["type"] == "ai", state
    return last


def _screen(parts: list[StreamPart]) -> dict[str, str]:
    """What a UI shows in `messages` mode: each message's latest partial or complete."""
    shown: dict[str, str] = {}
    for part in parts:
        if part.event in ("messages/partial", "messages/complete"):
            for message in part.data:
                shown[message["id"]] = message["content"]
    return shown


async def test_threads_and_the_assistant(stack: Stack) -> None:
    """Client-chosen thread ids are per tenant; the one assistant is found."""
    a, b = _client(stack.url("/")), _client(stack.url("/"), "key-b")
    made = await a.threads.create()
    assert (await a.threads.get(made["thread_id"]))["thread_id"] == made["thread_id"]
    await a.threads.create(thread_id="shared-id")
    with pytest.raises(ConflictError):
        await a.threads.create(thread_id="shared-id")
    assert (await a.threads.create(thread_id="shared-id", if_exists="do_nothing"))[
        "thread_id"] == "shared-id"
    await b.threads.create(thread_id="shared-id")  # another tenant: another thread
    await a.runs.wait("shared-id", "agent", input=_input("only tenant a says this"))
    b_state = await b.threads.get_state("shared-id")
    assert b_state["values"]["messages"] == []
    a_state = await a.threads.get_state("shared-id")
    assert [m["type"] for m in a_state["values"]["messages"]] == ["human", "ai"]
    with pytest.raises(NotFoundError):
        await b.threads.get(made["thread_id"])
    found = await b.threads.search(limit=100)
    assert [t["thread_id"] for t in found].count("shared-id") == 1
    assert made["thread_id"] not in [t["thread_id"] for t in found]
    assistants = await a.assistants.search()
    assert [x["graph_id"] for x in assistants] == ["agent"]
    assert (await a.assistants.get("agent"))["assistant_id"] == assistants[0]["assistant_id"]


async def test_stream_in_messages_modes_gets_the_stored_answer(stack: Stack) -> None:
    """runs.stream: tuple chunks add up to the stored answer; partials end on it too."""
    client = _client(stack.url("/"))
    thread = await client.threads.create()
    parts = [p async for p in client.runs.stream(
        thread["thread_id"], "agent", input=_input("hello over langgraph"),
        stream_mode=["messages-tuple", "values", "updates"])]
    assert parts[0].event == "metadata" and parts[-1].event == "end"
    stored = await _stored(client, thread["thread_id"])
    chunks = [p.data[0] for p in parts if p.event == "messages"]
    assert "".join(c["content"] for c in chunks) == stored["content"]
    assert {c["id"] for c in chunks} == {stored["id"]}
    assert [p for p in parts if p.event == "values"][-1].data["messages"][-1] == stored
    assert [p.data for p in parts if p.event == "updates"] == [{"agent": {"messages": [stored]}}]

    parts = [p async for p in client.runs.stream(
        thread["thread_id"], "agent", input=_input("and once more"), stream_mode="messages")]
    stored = await _stored(client, thread["thread_id"])
    assert _screen(parts) == {stored["id"]: stored["content"]}


async def test_values_and_state_are_bounded_and_page_back(stack: Stack,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`values` parts and /state hold the newest VALUES_CAP messages; `before` pages back."""
    monkeypatch.setattr(langgraph_threads, "VALUES_CAP", 1)
    client = _client(stack.url("/"))
    thread_id = (await client.threads.create())["thread_id"]
    await client.runs.wait(thread_id, "agent", input=_input("first"))
    parts = [p async for p in client.runs.stream(thread_id, "agent", input=_input("second"),
                                                 stream_mode="values")]
    assert all(len(p.data["messages"]) == 1 for p in parts if p.event == "values")
    pages, before = [], None
    while True:
        state = await client.threads.get_state(
            thread_id, params=None if before is None else {"before": before})
        pages.append(state["values"]["messages"])
        before = state["metadata"]["messages_before"]
        if before is None:
            break
    texts = [m["content"] for page in reversed(pages) for m in page]
    assert [m["type"] for page in reversed(pages) for m in page] == ["human", "ai"] * 2
    assert texts[0] == "first" and texts[2] == "second"


async def test_wait_cancel_and_the_multitask_strategy(stack: Stack) -> None:
    """runs.wait answers the final values; a running run is cancelled; 'reject' is the default."""
    client = _client(stack.url("/"))
    thread_id = (await client.threads.create())["thread_id"]
    values = await client.runs.wait(thread_id, "agent", input=_input("wait for me"))
    assert values["messages"][-1] == await _stored(client, thread_id)

    run = await client.runs.create(thread_id, "agent", input=_input("[hang] cancel me"))
    async with contextlib.aclosing(client.runs.join_stream(
            thread_id, run["run_id"], stream_mode="messages-tuple")) as joined:
        async for part in joined:
            if part.event == "messages":
                break  # a marker: the run is answering
    with pytest.raises(ConflictError):  # reject: a run is active
        await client.runs.create(thread_id, "agent", input=_input("me too"))
    with pytest.raises(UnprocessableEntityError, match="multitask_strategy"):
        await client.runs.create(thread_id, "agent", input=_input("me too"),
                                 multitask_strategy="shove")
    await client.runs.cancel(thread_id, run["run_id"], wait=True)
    assert (await client.runs.get(thread_id, run["run_id"]))["status"] == "interrupted"
    listed = await client.runs.list(thread_id)
    assert listed[0]["run_id"] == run["run_id"] and len(listed) == 2


async def test_join_stream_resumes_across_a_gateway_kill(stack: Stack, tmp_path: Path) -> None:
    """join_stream from a gateway killed with SIGKILL mid-run: the SDK's own reconnect
    (Location, Last-Event-ID) gives exactly what an uninterrupted client got."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**stack.env, "THREADLINE_HTTP_PORT": str(port)}
    gateway = RoleProcess("gateway", env, tmp_path / "gateway.log").start()
    try:
        await wait_healthy(stack.session, f"{base}/healthz", timeout=60)
        client, watcher = _client(base), _client(stack.url("/"))
        thread_id = (await client.threads.create())["thread_id"]
        run = await client.runs.create(thread_id, "agent", input=_input(f"[slow] {LONG}"))
        modes = ["messages-tuple", "values"]
        reference_task = asyncio.create_task(_collect(watcher.runs.join_stream(
            thread_id, run["run_id"], stream_mode=modes)))
        parts: list[StreamPart] = []
        async for part in client.runs.join_stream(thread_id, run["run_id"], stream_mode=modes):
            parts.append(part)
            if sum(p.event == "messages" for p in parts) == 2 and gateway.alive():
                gateway.kill9()
                gateway = RoleProcess("gateway", env, tmp_path / "gateway2.log").start()
        reference = await reference_task
        assert sum(p.event == "messages" for p in parts) > 2
        assert parts == reference, gateway.tail()
        # The SDK reconnected to the restarted gateway itself, with the last id it had
        # (aiohttp writes the access line once the response is finished: wait for it).
        await asyncio.to_thread(gateway.wait_for_log,
                                f"GET /langgraph/threads/{thread_id}/runs/{run['run_id']}/stream", 30)
        stored = await _stored(watcher, thread_id)
        assert "".join(p.data[0]["content"] for p in parts if p.event == "messages") == \
            stored["content"]
    finally:
        gateway.stop()


async def _collect(stream: Any) -> list[StreamPart]:
    return [p async for p in stream]


async def test_a_worker_killed_mid_answer_ends_with_the_stored_answer(stack: Stack) -> None:
    """In `messages` mode the next execution's empty partial drops the superseded text,
    and the screen ends with exactly the stored answer."""
    client = _client(stack.url("/"))
    thread_id = (await client.threads.create())["thread_id"]
    parts: list[StreamPart] = []
    killed = False
    async for part in client.runs.stream(thread_id, "agent", input=_input(f"[slow] {LONG}"),
                                         stream_mode="messages"):
        parts.append(part)
        if not killed and part.event == "messages/partial" and part.data[0]["content"]:
            killed = True
            stack.worker.kill9()
            stack.worker.start()
    stored = await _stored(client, thread_id)
    assert sum(p.event == "messages/metadata" for p in parts) >= 2  # two executions
    assert _screen(parts) == {stored["id"]: stored["content"]}


async def _answering(client: Any, thread_id: str, run_id: str) -> None:
    """Return once the run streams its answer (a marker that it is the active run)."""
    async with contextlib.aclosing(client.runs.join_stream(
            thread_id, run_id, stream_mode="messages-tuple")) as joined:
        async for part in joined:
            if part.event == "messages":
                return
    raise AssertionError(f"run {run_id} ended before it streamed")


def _transcript(state: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["type"], m["content"]) for m in state["values"]["messages"]]


@pytest.mark.parametrize("strategy", ["reject", "enqueue", "interrupt", "rollback"])
async def test_each_multitask_strategy_under_a_double_text(stack: Stack, strategy: str) -> None:
    """A second runs.create while the first run streams, with each strategy, as the SDK
    sends it: reject is 409; enqueue runs it after the first, whose answer stays;
    interrupt ends the first 'interrupted' and answers the second; rollback removes
    the first run and its question from the thread."""
    client = _client(stack.url("/"))
    thread_id = (await client.threads.create())["thread_id"]
    first = await client.runs.create(thread_id, "agent", input=_input(f"[slow] first {LONG}"))
    await _answering(client, thread_id, first["run_id"])
    if strategy == "reject":
        with pytest.raises(ConflictError):
            await client.runs.create(thread_id, "agent", input=_input("second"),
                                     multitask_strategy="reject")
        await client.runs.cancel(thread_id, first["run_id"], wait=True)
        return
    second = await client.runs.create(thread_id, "agent", input=_input("second"),
                                      multitask_strategy=strategy)
    assert second["multitask_strategy"] == strategy and second["run_id"] != first["run_id"]
    # join_stream of the second run, even while it waits in the queue, ends on its answer
    parts = [p async for p in client.runs.join_stream(thread_id, second["run_id"],
                                                      stream_mode="messages-tuple")]
    answer = await _stored(client, thread_id)
    assert "".join(p.data[0]["content"] for p in parts if p.event == "messages") == \
        answer["content"]
    assert (await client.runs.get(thread_id, second["run_id"]))["status"] == "success"
    transcript = _transcript(await client.threads.get_state(thread_id))
    asked = [text for kind, text in transcript if kind == "human"]
    if strategy == "enqueue":
        assert (await client.runs.get(thread_id, first["run_id"]))["status"] == "success"
        assert asked == [f"[slow] first {LONG}", "second"]
        assert [kind for kind, _ in transcript] == ["human", "ai", "human", "ai"]
    elif strategy == "interrupt":
        assert (await client.runs.get(thread_id, first["run_id"]))["status"] == "interrupted"
        state = await client.threads.get_state(thread_id)
        while len(state["values"]["messages"]) < 4:  # the partial answer is stored last
            await asyncio.sleep(0.1)
            state = await client.threads.get_state(thread_id)
        first_q, partial, second_q, last = state["values"]["messages"]
        assert (first_q["content"], second_q["content"]) == (f"[slow] first {LONG}", "second")
        assert partial["type"] == "ai" and partial["additional_kwargs"]["threadline_partial"]
        assert partial["response_metadata"]["finish_reason"] == "interrupted"
        assert partial["content"]  # the run had streamed (the marker above)
        assert last == answer
    else:
        with pytest.raises(NotFoundError):
            await client.runs.get(thread_id, first["run_id"])
        assert transcript == [("human", "second"), ("ai", answer["content"])]


async def test_two_enqueued_double_texts_sent_at_once_run_once_each(stack: Stack) -> None:
    """Two runs.create with enqueue sent together while a run streams: both accepted,
    each answered once, the thread holds three questions and three answers."""
    client = _client(stack.url("/"))
    thread_id = (await client.threads.create())["thread_id"]
    first = await client.runs.create(thread_id, "agent", input=_input(f"[slow] {LONG}"))
    await _answering(client, thread_id, first["run_id"])
    runs = await asyncio.gather(*(client.runs.create(
        thread_id, "agent", input=_input(f"queued {n}"), multitask_strategy="enqueue")
        for n in range(2)))
    for run in runs:
        await client.runs.join(thread_id, run["run_id"])
        assert (await client.runs.get(thread_id, run["run_id"]))["status"] == "success"
    transcript = _transcript(await client.threads.get_state(thread_id))
    assert [kind for kind, _ in transcript] == ["human", "ai"] * 3
    assert sorted(text for kind, text in transcript[2:] if kind == "human") == \
        ["queued 0", "queued 1"]
