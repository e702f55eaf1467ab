"""LangGraph checkpoints over a thread's branches (issue #30), driven by the official
`langgraph-sdk` against the real stack: get_history lists the current branch's
checkpoints; a run from an earlier checkpoint with new input edits (a new branch);
a run from a user message's checkpoint without input regenerates its answer. Each
branch's stored history is read natively (GET /v1/threads/{id}/messages) and through
get_state / get_history, and they agree. A checkpoint's run follows the multitask
strategy and its Idempotency-Key like any regenerate or edit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError

from tests.gateway.conftest import Stack

pytestmark = pytest.mark.kafka


def _client(stack: Stack) -> Any:
    return get_client(url=stack.url("/langgraph"), api_key="key-a")


def _input(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def _ids(states: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """Each checkpoint's id and its parent's."""
    return [(s["checkpoint"]["checkpoint_id"],
             s["parent_checkpoint"] and s["parent_checkpoint"]["checkpoint_id"]) for s in states]


def _lg(state: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(m["type"], m["id"], m["content"]) for m in state["values"]["messages"]]


@contextlib.contextmanager
def _problem(status: int, slug: str) -> Iterator[None]:
    """The SDK raises an httpx.HTTPStatusError (or its subclass) of this problem."""
    with pytest.raises(httpx.HTTPStatusError) as raised:
        yield
    response = raised.value.response
    assert response.status_code == status and response.json()["type"].endswith(slug), \
        response.text


async def _native(stack: Stack, thread_id: str, branch: int | None = None) -> \
        list[tuple[str, str, str]]:
    query = "" if branch is None else f"?branch={branch}"
    status, body = await stack.get(f"/v1/threads/{thread_id}/messages{query}")
    assert status == 200, body
    return [("human" if m["role"] == "user" else "ai", m["message_id"], m["text"])
            for m in body["messages"]]


async def _two_turns(stack: Stack, client: Any) -> str:
    thread_id = await stack.create_thread()  # a /v1 thread keeps its id on /langgraph
    await client.runs.wait(thread_id, "agent", input=_input("first"))
    await client.runs.wait(thread_id, "agent", input=_input("second"))
    return thread_id


async def test_history_lists_the_checkpoints_newest_first(stack: Stack) -> None:
    """Each stored message is a checkpoint (its seq + 1; "0" the empty thread), its
    parent the message before it, its values the path up to it."""
    client = _client(stack)
    thread_id = await _two_turns(stack, client)
    history = await client.threads.get_history(thread_id)
    assert _ids(history) == [("4", "3"), ("3", "2"), ("2", "1"), ("1", "0"), ("0", None)]
    native = await _native(stack, thread_id)
    assert [_lg(s) for s in history] == [native[:n] for n in (4, 3, 2, 1, 0)]
    state = await client.threads.get_state(thread_id)
    assert _ids([state]) == [("4", "3")] and _lg(state) == native
    assert [s["next"] for s in history[1:]] == [["agent"], [], ["agent"], []]

    assert _ids(await client.threads.get_history(thread_id, limit=2)) == [("4", "3"), ("3", "2")]
    older = await client.threads.get_history(thread_id, before="3")
    assert _ids(older) == [("2", "1"), ("1", "0"), ("0", None)]
    at = await client.threads.get_state(thread_id, checkpoint_id="2")
    assert _ids([at]) == [("2", "1")] and _lg(at) == native[:2]
    with pytest.raises(NotFoundError):
        await client.threads.get_state(thread_id, checkpoint_id="99")


async def test_an_edit_from_an_earlier_checkpoint_and_a_regenerate(stack: Stack) -> None:
    """Input from the checkpoint before a user message edits it: a new branch from its
    parent, the old one kept. No input from a user message's checkpoint answers it
    again, once per Idempotency-Key. Native reads and LangGraph's agree on each branch."""
    client = _client(stack)
    thread_id = await _two_turns(stack, client)
    old = await _native(stack, thread_id)

    values = await client.runs.wait(thread_id, "agent", input=_input("second, edited"),
                                    checkpoint_id="2")
    edited = await _native(stack, thread_id)
    assert edited[:2] == old[:2] and len(edited) == 4
    assert edited[2][0] == "human" and edited[2][2] == "second, edited"
    assert edited[3][0] == "ai" and edited[3][1] != old[3][1]
    assert [(m["type"], m["id"], m["content"]) for m in values["messages"]] == edited
    state = await client.threads.get_state(thread_id)
    assert _lg(state) == edited and _ids([state]) == [("6", "5")]
    history = await client.threads.get_history(thread_id)
    assert _ids(history) == [("6", "5"), ("5", "2"), ("2", "1"), ("1", "0"), ("0", None)]
    assert [_lg(s) for s in history] == [edited[:n] for n in (4, 3, 2, 1, 0)]
    # the old branch is kept: natively by ?branch=, and as its checkpoints
    assert await _native(stack, thread_id, branch=3) == old
    assert _lg(await client.threads.get_state(thread_id, checkpoint_id="4")) == old
    old_history = await client.threads.get_history(
        thread_id, checkpoint={"thread_id": thread_id, "checkpoint_ns": "",
                               "checkpoint_id": "4"})
    assert _ids(old_history) == [("4", "3"), ("3", "2"), ("2", "1"), ("1", "0"), ("0", None)]

    # a regenerate of the edited question, sent twice with one key: one new answer
    key = {"Idempotency-Key": "regenerate-edited-once"}
    run = await client.runs.create(thread_id, "agent", checkpoint_id="5", headers=key)
    again = await client.runs.create(thread_id, "agent", checkpoint_id="5", headers=key)
    assert again["run_id"] == run["run_id"]
    values = await client.runs.join(thread_id, run["run_id"])
    regenerated = await _native(stack, thread_id)
    assert regenerated[:3] == edited[:3] and regenerated[3][1] != edited[3][1]
    assert [(m["type"], m["id"], m["content"]) for m in values["messages"]] == regenerated
    state = await client.threads.get_state(thread_id)
    assert _lg(state) == regenerated and _ids([state]) == [("7", "5")]
    assert await _native(stack, thread_id, branch=5) == edited  # the edit's answer kept
    status, branches = await stack.get(f"/v1/threads/{thread_id}/branches")
    assert status == 200 and len(branches["branches"]) == 3, branches

    # a stream from the first question's checkpoint: its answer again, streamed
    parts = [p async for p in client.runs.stream(thread_id, "agent", checkpoint_id="1",
                                                 stream_mode="values")]
    latest = await _native(stack, thread_id)
    assert latest[0] == old[0] and len(latest) == 2 and latest[1][1] != old[1][1]
    assert [(m["type"], m["id"], m["content"])
            for m in [p for p in parts if p.event == "values"][-1].data["messages"]] == latest


async def test_checkpoints_of_another_branch(stack: Stack) -> None:
    """Input from the checkpoint before a user message of a branch that is not current
    edits that message; no input at its user message regenerates it; both make their
    branch current."""
    client = _client(stack)
    thread_id = await _two_turns(stack, client)
    await client.runs.wait(thread_id, "agent", input=_input("third"))
    old = await _native(stack, thread_id)  # seqs 0-5
    await client.runs.wait(thread_id, "agent", input=_input("second, edited"),
                           checkpoint_id="2")  # seqs 6, 7 on a new branch
    await client.runs.wait(thread_id, "agent", input=_input("third, edited"),
                           checkpoint_id="4")  # after the old branch's second answer
    edited = await _native(stack, thread_id)
    assert edited[:4] == old[:4] and edited[4][2] == "third, edited"
    assert edited[5][0] == "ai" and edited[5][1] != old[5][1] and len(edited) == 6
    state = await client.threads.get_state(thread_id)
    assert _lg(state) == edited and _ids([state]) == [("10", "9")]
    assert _ids(await client.threads.get_history(thread_id, limit=3)) == [
        ("10", "9"), ("9", "4"), ("4", "3")]

    await client.runs.wait(thread_id, "agent", checkpoint_id="7")  # "second, edited"
    again = await _native(stack, thread_id)
    assert again[2][2] == "second, edited" and len(again) == 4 and again[3][0] == "ai"
    assert again[3][1] not in {m[1] for m in old + edited}
    assert _lg(await client.threads.get_state(thread_id)) == again


async def test_what_a_checkpoint_cannot_start_is_a_clear_problem(stack: Stack) -> None:
    """No input at an answer's checkpoint, input after a user message, input at the
    newest message of a branch that is not current, and a subgraph checkpoint are
    refused, each saying why."""
    client = _client(stack)
    thread_id = await _two_turns(stack, client)
    with _problem(422, "checkpoint-unsupported"):
        await client.runs.wait(thread_id, "agent", checkpoint_id="2")  # at an answer
    with _problem(422, "checkpoint-unsupported"):
        await client.runs.wait(thread_id, "agent", input=_input("x"), checkpoint_id="3")
    await client.runs.wait(thread_id, "agent", input=_input("edited"), checkpoint_id="2")
    with _problem(422, "checkpoint-unsupported"):  # the old branch's newest
        await client.runs.wait(thread_id, "agent", input=_input("x"), checkpoint_id="4")
    with _problem(422, "unsupported"):
        await client.runs.wait(thread_id, "agent", input=_input("x"),
                               checkpoint={"checkpoint_ns": "sub", "checkpoint_id": "2"})
    with _problem(404, "no-such-checkpoint"):
        await client.runs.wait(thread_id, "agent", checkpoint_id="99")
    assert len(await _native(stack, thread_id)) == 4  # nothing else was stored


async def test_a_checkpoint_run_while_a_run_is_active_and_an_edit_sent_twice(stack: Stack) -> None:
    """A regenerate from a checkpoint while a run is active follows the multitask
    strategy (reject: 409); an edit sent twice with one Idempotency-Key runs once."""
    client = _client(stack)
    thread_id = await _two_turns(stack, client)
    run = await client.runs.create(thread_id, "agent", input=_input("[hang] hold on"))
    async with contextlib.aclosing(client.runs.join_stream(
            thread_id, run["run_id"], stream_mode="messages-tuple")) as joined:
        async for part in joined:
            if part.event == "messages":
                break  # a marker: the run is answering
    with _problem(409, "branch-conflict"):
        await client.runs.wait(thread_id, "agent", checkpoint_id="1")
    await client.runs.cancel(thread_id, run["run_id"], wait=True)
    before = await _native(stack, thread_id)

    key = {"Idempotency-Key": "edit-the-second-once"}
    first = await client.runs.create(thread_id, "agent", input=_input("second, once"),
                                     checkpoint_id="2", headers=key)
    second = await client.runs.create(thread_id, "agent", input=_input("second, once"),
                                      checkpoint_id="2", headers=key)
    assert second["run_id"] == first["run_id"]
    await client.runs.join(thread_id, first["run_id"])
    edited = await _native(stack, thread_id)
    assert edited[:2] == before[:2] and [m[2] for m in edited[2:3]] == ["second, once"]
    assert len(edited) == 4
    status, branches = await stack.get(f"/v1/threads/{thread_id}/branches")
    assert status == 200 and len(branches["branches"]) == 2, branches
