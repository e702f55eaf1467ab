"""Human in the loop over the LangGraph runs API, driven by the official `langgraph-sdk`
(public API only) against the real stack: a run that calls `interrupt()` streams
`__interrupt__` and its stream ends; the thread, its state and the run show it
interrupted; `command={"resume": value}` continues the same run with only what follows
the interrupt; `runs.wait`, cancel, a resume with nothing interrupted, and join_stream
with Last-Event-ID across the interrupt. The builtin agent asks when a message holds
`[approve]` (streams/agents/builtin.py)."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph_sdk.errors import ConflictError
from langgraph_sdk.schema import StreamPart

from tests.gateway.conftest import Stack
from tests.gateway.test_langgraph_sdk import _client, _input, _screen, _stored

pytestmark = pytest.mark.kafka

MODES = ["messages", "updates"]


async def _parts(stream: Any) -> list[StreamPart]:
    return [p async for p in stream]


def _interrupts(parts: list[StreamPart]) -> list[Any]:
    return [i for p in parts if p.event == "updates" and "__interrupt__" in p.data
            for i in p.data["__interrupt__"]]


async def test_interrupt_then_resume_with_a_command(stack: Stack) -> None:
    """The stream ends at `__interrupt__`; thread, state and run are interrupted; a
    command resumes the same run, streams only what follows, and the answer uses the
    value; what the screen shows is the stored answer, no text twice."""
    client = _client(stack.url("/"))
    thread_id = (await client.threads.create())["thread_id"]
    first = await _parts(client.runs.stream(thread_id, "agent", stream_mode=MODES,
                                            input=_input("deploy it [approve] [tools=1]")))
    run_id = first[0].data["run_id"]
    [asked] = _interrupts(first)
    assert asked["value"] == {"question": "May I answer 'deploy it [approve] [tools=1]'?"}
    assert [p.event for p in first[-2:]] == ["updates", "end"]
    before = _screen(first)
    assert len(before) == 1 and "Step 1: looking up" in next(iter(before.values()))

    thread = await client.threads.get(thread_id)
    assert thread["status"] == "interrupted"
    assert list(thread["interrupts"].values()) == [[asked]]
    state = await client.threads.get_state(thread_id)
    assert state["next"] == ["agent"] and state["interrupts"] == [asked]
    assert [t["interrupts"] for t in state["tasks"]] == [[asked]]
    assert list(thread["interrupts"]) == [state["tasks"][0]["id"]]
    assert (await client.runs.get(thread_id, run_id))["status"] == "interrupted"
    with pytest.raises(ConflictError):  # an interrupted run is active
        await client.runs.create(thread_id, "agent", input=_input("meanwhile"))

    second = await _parts(client.runs.stream(thread_id, "agent", stream_mode=MODES,
                                             command={"resume": "ship-42"}))
    assert second[0].data["run_id"] == run_id and second[-1].event == "end"
    assert not _interrupts(second)
    stored = await _stored(client, thread_id)
    assert stored["content"].endswith("Approved: ship-42.")
    assert stored["content"].count("Step 1: looking up") == 1
    assert _screen(first + second) == {stored["id"]: stored["content"]}
    assert [p.data for p in second if p.event == "updates"] == [
        {"agent": {"messages": [stored]}}]
    assert (await client.runs.get(thread_id, run_id))["status"] == "success"
    after = await client.threads.get(thread_id)
    assert after["status"] == "idle" and after["interrupts"] == {}

    # A client that saw the interrupt joins later with its Last-Event-ID: exactly what
    # the resumed stream sent, no gap, no repeat.
    interrupt_part = next(p for p in first if p.event == "updates")
    assert interrupt_part.id
    joined = await _parts(client.runs.join_stream(thread_id, run_id, stream_mode=MODES,
                                                  last_event_id=interrupt_part.id))
    assert joined == second[1:]


async def test_wait_with_a_command_resumes_by_interrupt_id(stack: Stack) -> None:
    """runs.wait answers the values with `__interrupt__`; a command keyed by the
    interrupt's id resumes; then the values hold the answer and no interrupt."""
    client = _client(stack.url("/"))
    thread_id = (await client.threads.create())["thread_id"]
    values = await client.runs.wait(thread_id, "agent", input=_input("may I [approve]"))
    [asked] = values["__interrupt__"]
    assert "may I" in asked["value"]["question"]
    assert [m["type"] for m in values["messages"]] == ["human"]
    values = await client.runs.wait(thread_id, "agent",
                                    command={"resume": {asked["id"]: "yes"}})
    assert "__interrupt__" not in values
    assert values["messages"][-1]["content"].endswith("Approved: yes.")
    assert values["messages"][-1] == await _stored(client, thread_id)


async def test_cancel_an_interrupted_run_and_resume_with_nothing_interrupted(
        stack: Stack) -> None:
    """An interrupted run is cancelled; a resume command then is a 409 conflict."""
    client = _client(stack.url("/"))
    thread_id = (await client.threads.create())["thread_id"]
    with pytest.raises(ConflictError, match="no interrupted run"):
        await client.runs.create(thread_id, "agent", command={"resume": "early"})
    run = await client.runs.create(thread_id, "agent", input=_input("cancel me [approve]"))
    joined = await _parts(client.runs.join_stream(thread_id, run["run_id"],
                                                  stream_mode="updates"))
    assert len(_interrupts(joined)) == 1  # the marker: the run waits
    assert (await client.threads.get(thread_id))["status"] == "interrupted"
    await client.runs.cancel(thread_id, run["run_id"], wait=True)
    thread = await client.threads.get(thread_id)
    assert thread["status"] == "idle" and thread["interrupts"] == {}
    with pytest.raises(ConflictError, match="no interrupted run"):
        await client.runs.stream(thread_id, "agent", command={"resume": "late"}).__anext__()
