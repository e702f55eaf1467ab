"""Branches over the native API and the AI SDK chat, against the real processor and
worker (issue #30): a regenerate answers again on a new branch and keeps the old one
readable, an edit starts a branch from the edited message's parent, a switch makes
any branch current again, and a key sent twice answers once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streams.testing.sse import read_sse
from tests.gateway.conftest import AUTH_A, AUTH_B, Stack

pytestmark = pytest.mark.kafka


async def _ended(stack: Stack, run_id: str) -> str:
    """The run's terminal event, read from its stream to `done`."""
    events = await read_sse(stack.session, stack.url(f"/v1/runs/{run_id}/events"),
                            headers=AUTH_A)
    assert events[-1].event == "done", [e.event for e in events]
    return events[-2].event


async def _answered_thread(stack: Stack, text: str = "hello") -> tuple[str, dict[str, Any]]:
    """A thread with one question answered: its id and the question's JSON."""
    thread_id = await stack.create_thread()
    status, posted = await stack.post(thread_id, text)
    assert status == 202, posted
    assert await _ended(stack, posted["run_id"]) == "run_completed", stack.logs()
    return thread_id, await _question(stack, thread_id)


async def _question(stack: Stack, thread_id: str) -> dict[str, Any]:
    messages = await _messages(stack, thread_id)
    return next(m for m in messages if m["role"] == "user")


async def _messages(stack: Stack, thread_id: str, branch: int | None = None) -> \
        list[dict[str, Any]]:
    query = "" if branch is None else f"?branch={branch}"
    status, body = await stack.get(f"/v1/threads/{thread_id}/messages{query}")
    assert status == 200, body
    return list(body["messages"])


async def test_a_regenerate_answers_again_on_a_new_branch_and_keeps_the_old_one(
        stack: Stack) -> None:
    """202 with the regenerate's run; the same key again is that run (one answer); the
    current branch holds the new answer, the old branch its old one, read by `branch`;
    the branch list says where the new one forks."""
    thread_id, question = await _answered_thread(stack)
    [first_answer] = [m for m in await _messages(stack, thread_id) if m["role"] == "assistant"]
    path = f"/v1/threads/{thread_id}/messages/{question['message_id']}/regenerate"
    status, regenerated = await stack.call(path, key="regen-1")
    assert status == 202 and regenerated["status"] == "accepted", regenerated
    assert regenerated["branch"] == question["seq"]
    assert regenerated["message_id"] == question["message_id"]
    status, again = await stack.call(path, key="regen-1")
    assert status == 202 and again.get("replayed") is True, again
    assert again["run_id"] == regenerated["run_id"]
    events = await read_sse(stack.session, stack.url(f"/v1/runs/{regenerated['run_id']}/events"),
                            headers=AUTH_A)
    assert events[-2].event == "run_completed", stack.logs()

    current = await _messages(stack, thread_id)
    assert events[-2].json["branch"] == current[1]["seq"]  # the stream names the branch
    assert [m["role"] for m in current] == ["user", "assistant"]
    assert current[0]["message_id"] == question["message_id"]
    assert current[1]["run_id"] == regenerated["run_id"]
    assert current[1]["parent_seq"] == question["seq"]
    status, thread = await stack.get(f"/v1/threads/{thread_id}")
    assert thread["branch"] == current[1]["seq"] and thread["branch_count"] == 2, thread
    status, listed = await stack.get(f"/v1/threads/{thread_id}/branches")
    assert status == 200, listed
    assert [(b["branch"], b["current"], b["fork_seq"], b["first_seq"], b["message_count"])
            for b in listed["branches"]] == [
        (current[1]["seq"], True, current[1]["seq"], None, 2),
        (first_answer["seq"], False, question["seq"], first_answer["seq"], 2)]
    status, lg_state = await stack.get(f"/langgraph/threads/{thread_id}/state")
    assert status == 200 and [m["id"] for m in lg_state["values"]["messages"]] == [
        m["message_id"] for m in current], lg_state  # LangGraph reads the current branch too
    old = await _messages(stack, thread_id, branch=first_answer["seq"])
    assert [m["message_id"] for m in old] == [question["message_id"], first_answer["message_id"]]
    # Named by the answer, a regenerate answers its question again.
    status, by_answer = await stack.call(
        f"/v1/threads/{thread_id}/messages/{current[1]['message_id']}/regenerate",
        key="regen-2")
    assert status == 202 and by_answer["branch"] == question["seq"], by_answer
    assert await _ended(stack, by_answer["run_id"]) == "run_completed", stack.logs()
    status, listed = await stack.get(f"/v1/threads/{thread_id}/branches")
    assert len(listed["branches"]) == 3, listed


async def test_an_edit_branches_from_the_edited_messages_parent_and_a_switch_goes_back(
        stack: Stack) -> None:
    """The edited message stays; the new one runs on a branch of its own; a switch makes
    the first branch current again, and then posts go on from there."""
    thread_id, question = await _answered_thread(stack, "first text")
    path = f"/v1/threads/{thread_id}/messages/{question['message_id']}/edit"
    status, edited = await stack.call(path, {"input_text": "second text",
                                             "message_id": "edited-1"}, key="edit-1")
    assert status == 202 and edited["message_id"] == "edited-1", edited
    assert edited["edited_message_id"] == question["message_id"]
    status, again = await stack.call(path, {"input_text": "second text",
                                            "message_id": "edited-1"}, key="edit-1")
    assert status == 202 and again["run_id"] == edited["run_id"], again
    assert await _ended(stack, edited["run_id"]) == "run_completed", stack.logs()
    current = await _messages(stack, thread_id)
    assert (current[0]["role"], current[0]["text"]) == ("user", "second text")
    assert current[0]["parent_seq"] == -1 and len(current) == 2
    status, listed = await stack.get(f"/v1/threads/{thread_id}/branches")
    [_, old] = listed["branches"]
    assert (old["fork_seq"], old["first_seq"], old["message_count"]) == (-1, 0, 2), listed
    status, switched = await stack.call(f"/v1/threads/{thread_id}/branches/current",
                                        {"branch": old["branch"]})
    assert status == 200 and switched["status"] == "switched", switched
    status, same = await stack.call(f"/v1/threads/{thread_id}/branches/current",
                                    {"branch": old["branch"]})
    assert status == 200 and same["status"] == "current", same
    assert (await _messages(stack, thread_id))[0]["text"] == "first text"
    status, posted = await stack.post(thread_id, "go on")
    assert status == 202 and await _ended(stack, posted["run_id"]) == "run_completed"
    went_on = await _messages(stack, thread_id)
    assert [m["text"] for m in went_on][::2] == ["first text", "go on"], went_on
    assert went_on[2]["parent_seq"] == old["branch"]


async def test_branch_requests_that_name_nothing_are_problems(stack: Stack) -> None:
    """An unknown message or branch is a 404 problem; another tenant sees no thread."""
    thread_id, question = await _answered_thread(stack)
    status, problem = await stack.call(f"/v1/threads/{thread_id}/messages/nope/regenerate")
    assert status == 404 and problem["type"].endswith("no-such-message"), problem
    status, problem = await stack.call(f"/v1/threads/{thread_id}/messages/nope/edit",
                                       {"input_text": "x"})
    assert status == 404, problem
    status, problem = await stack.get(f"/v1/threads/{thread_id}/messages?branch=99")
    assert status == 404 and problem["type"].endswith("no-such-branch"), problem
    status, problem = await stack.call(f"/v1/threads/{thread_id}/branches/current",
                                       {"branch": 99})
    assert status == 404, problem
    status, problem = await stack.call(f"/v1/threads/{thread_id}/branches/current",
                                       {"branch": "x"})
    assert status == 422, problem
    status, problem = await stack.call(
        f"/v1/threads/{thread_id}/messages/{question['message_id']}/edit", {"input_text": "  "})
    assert status == 422, problem
    status, _ = await stack.get(f"/v1/threads/{thread_id}/branches", auth=AUTH_B)
    assert status == 404
    status, listed = await stack.get(f"/v1/threads/{thread_id}/branches")
    assert [b["current"] for b in listed["branches"]] == [True]  # never branched: one


async def _chat(stack: Stack, body: dict[str, Any]) -> tuple[int, list[Any]]:
    async with stack.session.post(stack.url("/v1/ai/chat"), json=body,
                                  headers=AUTH_A) as response:
        raw = await response.text()
    if response.status != 200:
        return response.status, [raw]
    return 200, [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                 for line in raw.split("\n") if line.startswith("data: ")]


def _user(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


async def test_the_ai_sdk_chat_regenerates_and_edits(stack: Stack) -> None:
    """`regenerate()` streams a new answer that replaces the old one in the chat's
    messages; `sendMessage({text, messageId})` of an earlier message edits it."""
    chat_id = f"branches-{stack.url('/')[-6:-1]}-{id(stack) % 10_000}"
    first = [_user("ui-1", "what is kafka")]
    status, chunks = await _chat(stack, {"id": chat_id, "trigger": "submit-message",
                                         "messages": first})
    assert status == 200 and chunks[-1] == "[DONE]", chunks
    first_answer = chunks[0]["messageId"]
    status, again = await _chat(stack, {"id": chat_id, "trigger": "regenerate-message",
                                        "messages": first, "messageId": first_answer})
    assert status == 200 and again[-1] == "[DONE]", again
    assert again[0]["messageId"] != first_answer
    status, twice = await _chat(stack, {"id": chat_id, "trigger": "regenerate-message",
                                        "messages": first, "messageId": first_answer})
    assert status == 200 and twice[0]["messageId"] == again[0]["messageId"]  # answered once
    status, body = await stack.get(f"/v1/ai/chat/{chat_id}/messages")
    assert [m["id"] for m in body["messages"]][1:] == [again[0]["messageId"]], body

    status, edited = await _chat(stack, {"id": chat_id, "trigger": "submit-message",
                                         "messageId": "ui-1",
                                         "messages": [_user("ui-1", "what is a topic")]})
    assert status == 200 and edited[-1] == "[DONE]", edited
    status, body = await stack.get(f"/v1/ai/chat/{chat_id}/messages")
    texts = [p["text"] for m in body["messages"] for p in m["parts"] if p.get("type") == "text"]
    assert texts[0] == "what is a topic" and len(body["messages"]) == 2, body
    status, branches = await stack.get(f"/v1/threads/{body['thread_id']}/branches")
    assert len(branches["branches"]) == 3, branches
    # Edited back to its first text: a new answer on a fourth branch, not a resend of
    # the first post (whose branch is no longer current).
    back = {"id": chat_id, "trigger": "submit-message", "messageId": "ui-1",
            "messages": [_user("ui-1", "what is kafka")]}
    status, edited_back = await _chat(stack, back)
    assert status == 200 and edited_back[-1] == "[DONE]", edited_back
    assert edited_back[0]["messageId"] not in (first_answer, again[0]["messageId"],
                                               edited[0]["messageId"])
    status, resent = await _chat(stack, back)  # the same request again: the same run
    assert status == 200 and resent[0]["messageId"] == edited_back[0]["messageId"]
    status, body = await stack.get(f"/v1/ai/chat/{chat_id}/messages")
    assert [m["id"] for m in body["messages"]][1:] == [edited_back[0]["messageId"]], body
    status, branches = await stack.get(f"/v1/threads/{body['thread_id']}/branches")
    assert len(branches["branches"]) == 4, branches
