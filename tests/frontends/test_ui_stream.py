"""The UI message stream mapping alone: each of our events' chunks, every chunk within
the SDK's field list, a run with a superseded attempt, and the tool approval (an
interrupt inside a tool): the request, the answer read from the SDK's message, and the
stream that follows the answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.adapters.ai_sdk.approvals import approval_id, approval_in, parse_approval_id
from gateway.adapters.ai_sdk.ui_stream import CHUNK_FIELDS, DONE, UiMessageStream, chunk_frame, ui_message
from gateway.http.problems import Problem
from streams.core.domain import Citation, Step, StoredMessage
from streams.core.records import MessageRecord

RUN, THREAD, MESSAGE = "run-1", "thread-1", "answer-1"


def _ev(event: str, /, **fields: Any) -> tuple[str, dict[str, Any]]:
    return event, {"thread_id": THREAD, "run_id": RUN, "message_id": MESSAGE, "attempt": 0,
                  **fields}


def _run(*events: tuple[str, dict[str, Any]]) -> list[Any]:
    stream = UiMessageStream()
    return [chunk for name, data in events for chunk in stream.chunks(name, data)]


def _strict(chunks: list[Any]) -> None:
    for chunk in chunks:
        if chunk == DONE:
            continue
        kind = "data-*" if chunk["type"].startswith("data-") else chunk["type"]
        assert kind in CHUNK_FIELDS, chunk
        assert set(chunk) <= CHUNK_FIELDS[kind], f"extra fields in {chunk}"


HAPPY = [
    _ev("run_accepted", user_message_id="u1", detail=""),
    _ev("attempt_dispatched", attempt=1, user_message_id="u1", detail=""),
    _ev("message_start", attempt=1, role="assistant"),
    _ev("text_start", attempt=1),
    _ev("text_delta", attempt=1, delta="Hello"),
    _ev("text_delta", attempt=1, delta=" world"),
    _ev("text_end", attempt=1, text="Hello world"),
    _ev("step", attempt=1, kind="tool_call", name="search", payload_json='{"query": "q"}'),
    _ev("step", attempt=1, kind="tool_result", name="search", payload_json='{"hits": 1}'),
    _ev("citations", attempt=1, citations=[{"url": "https://example.com/a", "title": "A"}]),
    _ev("message_end", attempt=1, finish_reason="stop"),
    _ev("run_completed", attempt=1, user_message_id="u1", detail="", message={}),
    ("done", {}),
]


def test_a_completed_run_maps_to_the_sdk_chunk_sequence() -> None:
    """start, a step with text, a tool call and its result, a source, finish, [DONE]."""
    chunks = _run(*HAPPY)
    _strict(chunks)
    types = [c if c == DONE else c["type"] for c in chunks]
    assert types == ["start", "data-run", "data-run", "start-step", "text-start", "text-delta",
                     "text-delta", "text-end", "tool-input-available", "tool-output-available",
                     "source-url", "finish-step", "data-run", "finish", DONE]
    assert chunks[0]["messageId"] == MESSAGE
    text_id = chunks[4]["id"]
    assert [c["delta"] for c in chunks if c != DONE and c["type"] == "text-delta"] == \
        ["Hello", " world"]
    assert all(c["id"] == text_id for c in chunks[4:8])
    call, result = chunks[8], chunks[9]
    assert call["toolCallId"] == result["toolCallId"] and call["input"] == {"query": "q"}
    assert result["output"] == {"hits": 1} and call["dynamic"] is True
    assert chunks[10] == {"type": "source-url", "sourceId": chunks[10]["sourceId"],
                          "url": "https://example.com/a", "title": "A"}
    assert chunks[-2]["finishReason"] == "stop"
    assert chunks[-3]["data"]["event"] == "run_completed"


def test_a_superseded_attempt_ends_its_step_and_text_and_tags_each_text_part() -> None:
    """The worker died mid-answer: the next attempt opens a new step and text part."""
    chunks = _run(
        _ev("run_accepted", user_message_id="u1", detail=""),
        _ev("attempt_dispatched", attempt=1, user_message_id="u1", detail=""),
        _ev("message_start", attempt=1, role="assistant"),
        _ev("text_start", attempt=1),
        _ev("text_delta", attempt=1, delta="Hel"),
        _ev("retry_scheduled", attempt=1, user_message_id="u1", detail="heartbeat_timeout"),
        _ev("attempt_dispatched", attempt=2, user_message_id="u1", detail=""),
        _ev("message_start", attempt=2, role="assistant"),
        _ev("text_start", attempt=2),
        _ev("text_delta", attempt=2, delta="Hello"),
        _ev("message_end", attempt=2, finish_reason="stop"),
        _ev("run_completed", attempt=2, user_message_id="u1", detail="", message={}),
        ("done", {}),
    )
    _strict(chunks)
    types = [c if c == DONE else c["type"] for c in chunks]
    assert types.count("start-step") == types.count("finish-step") == 2
    assert types.count("text-start") == types.count("text-end") == 2
    starts = [c for c in chunks if c != DONE and c["type"] == "text-start"]
    assert [s["providerMetadata"]["threadline"]["attempt"] for s in starts] == [1, 2]
    assert starts[0]["id"] != starts[1]["id"]
    retry = next(c for c in chunks if c != DONE and c["type"] == "data-run"
                 and c["data"]["event"] == "retry_scheduled")
    assert retry["data"]["detail"] == "heartbeat_timeout"
    assert chunks[-2]["messageMetadata"]["attempt"] == 2


def test_a_cancelled_run_ends_with_abort_and_a_failed_one_with_error() -> None:
    """Cancelled: `abort`; failed: `error` then `finish` with reason error."""
    head = [_ev("run_accepted", user_message_id="u1", detail=""),
            _ev("message_start", attempt=1, role="assistant"),
            _ev("text_delta", attempt=1, delta="x")]
    cancelled = _run(*head, _ev("run_cancelled", attempt=1, user_message_id="u1",
                                detail="stopped"), ("done", {}))
    _strict(cancelled)
    assert [c if c == DONE else c["type"] for c in cancelled][-5:] == \
        ["text-end", "finish-step", "data-run", "abort", DONE]
    failed = _run(*head, _ev("run_failed", attempt=1, user_message_id="u1", detail="boom"),
                  ("done", {}))
    _strict(failed)
    assert failed[-3] == {"type": "error", "errorText": "boom"}
    assert failed[-2]["finishReason"] == "error"


def test_frames_are_data_lines_and_done_is_the_literal() -> None:
    """`data: <json>` frames, and `data: [DONE]` last."""
    assert chunk_frame({"type": "abort"}) == b'data: {"type":"abort"}\n\n'
    assert chunk_frame(DONE) == b"data: [DONE]\n\n"


def test_a_stored_answer_is_a_ui_message_with_its_tool_parts_and_sources() -> None:
    """`useChat`'s initial messages: text, dynamic tool parts with output, source urls."""
    message = StoredMessage(
        message_id="a1", role="assistant", run_id=RUN, text="Hi", created_at_ms=5,
        steps=(Step("tool_call", "search", '{"q": 1}'), Step("tool_result", "search", "[1]")),
        citations=(Citation("https://example.com", "Ex"),))
    ui = ui_message(MessageRecord(seq=3, message=message))
    assert ui["id"] == "a1" and ui["role"] == "assistant"
    assert [p["type"] for p in ui["parts"]] == ["step-start", "text", "dynamic-tool",
                                                "source-url"]
    tool = ui["parts"][2]
    assert tool["state"] == "output-available" and tool["input"] == {"q": 1}
    assert tool["output"] == [1]
    json.dumps(ui)


def test_chat_ids_are_namespaced_per_tenant() -> None:
    """The same chat id of two tenants names two threads; one tenant's, always the same."""
    from gateway.adapters.ai_sdk.chat import chat_thread_id

    assert chat_thread_id("a", "chat-1") == chat_thread_id("a", "chat-1")
    assert chat_thread_id("a", "chat-1") != chat_thread_id("b", "chat-1")
    assert chat_thread_id("a", "b:c") != chat_thread_id("a:b", "c")


def test_a_resumed_interrupt_tags_its_text_with_a_new_execution() -> None:
    """The interrupt closes its step with a data-run (the question); the resumed
    execution, in the same attempt, replays the journaled text under a new execution:
    the newest execution's text parts are exactly the stored answer."""
    chunks = _run(
        _ev("run_accepted", user_message_id="u1", detail=""),
        _ev("attempt_dispatched", attempt=1, user_message_id="u1", detail=""),
        _ev("message_start", attempt=1, part_id="exA:message"),
        _ev("text_delta", attempt=1, part_id="exA:text:0", delta="Step"),
        _ev("message_end", attempt=1, finish_reason="interrupted"),
        _ev("interrupt", attempt=1, user_message_id="u1", detail='{"question": "ok?"}'),
        _ev("attempt_dispatched", attempt=1, user_message_id="u1", detail=""),
        _ev("message_start", attempt=1, part_id="exB:message"),
        _ev("text_delta", attempt=1, part_id="exB:text:0", delta="Step"),
        _ev("text_delta", attempt=1, part_id="exB:text:0", delta=" done"),
        _ev("message_end", attempt=1, finish_reason="stop"),
        _ev("run_completed", attempt=1, user_message_id="u1", detail="", message={}))
    _strict(chunks)
    asked = [c for c in chunks if c["type"] == "data-run" and c["data"]["event"] == "interrupt"]
    assert [json.loads(c["data"]["detail"]) for c in asked] == [{"question": "ok?"}]
    texts: dict[str, tuple[str, str]] = {}  # text id -> (execution, text)
    for chunk in chunks:
        if chunk["type"] == "text-start":
            texts[chunk["id"]] = (chunk["providerMetadata"]["threadline"]["execution"], "")
        elif chunk["type"] == "text-delta":
            execution, text = texts[chunk["id"]]
            texts[chunk["id"]] = (execution, text + chunk["delta"])
    newest = list(texts.values())[-1][0]
    assert [e for e, _ in texts.values()] == ["exA", "exB"]
    assert "".join(t for e, t in texts.values() if e == newest) == "Step done"


# --- tool approval (an interrupt raised inside a tool) ---------------------------------

ASK = '{"question": "May I deploy?", "tool": "confirm"}'


def _asking_run(answered: bool) -> list[tuple[str, dict[str, Any]]]:
    """A run whose `confirm` tool asks (execution A), and, once answered, execution B
    replaying the `lookup` call and running `confirm` again to its result."""
    head = [
        _ev("run_accepted", user_message_id="u1", detail=""),
        _ev("attempt_dispatched", attempt=1, user_message_id="u1", detail=""),
        _ev("message_start", attempt=1, part_id="exA:message"),
        _ev("text_delta", attempt=1, part_id="exA:text:0", delta="Step 1."),
        _ev("step", attempt=1, kind="tool_call", name="lookup", payload_json='{"query": "q"}'),
        _ev("step", attempt=1, kind="tool_result", name="lookup", payload_json='{"fact": 1}'),
        _ev("citations", attempt=1, citations=[{"url": "https://example.com/a", "title": "A"}]),
        _ev("step", attempt=1, kind="tool_call", name="confirm", payload_json='{"action": "x"}'),
        _ev("message_end", attempt=1, finish_reason="interrupted"),
        _ev("interrupt", attempt=1, user_message_id="u1", detail=ASK),
    ]
    if not answered:
        return head
    return [*head,
            _ev("attempt_dispatched", attempt=1, user_message_id="u1", detail=""),
            _ev("message_start", attempt=1, part_id="exB:message"),
            _ev("text_delta", attempt=1, part_id="exB:text:0", delta="Step 1."),
            _ev("step", attempt=1, kind="tool_call", name="lookup",
                payload_json='{"query": "q"}'),
            _ev("step", attempt=1, kind="tool_result", name="lookup", payload_json='{"fact": 1}'),
            _ev("citations", attempt=1, citations=[{"url": "https://example.com/a",
                                                    "title": "A"}]),
            _ev("step", attempt=1, kind="tool_call", name="confirm",
                payload_json='{"action": "x"}'),
            _ev("step", attempt=1, kind="tool_result", name="confirm",
                payload_json='{"content": {"answer": {"approved": true}}}'),
            _ev("text_delta", attempt=1, part_id="exB:text:1", delta=" Done."),
            _ev("message_end", attempt=1, finish_reason="stop"),
            _ev("run_completed", attempt=1, user_message_id="u1", detail="", message={}),
            ("done", {})]


def _feed(stream: UiMessageStream, events: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    return [chunk for name, data in events for chunk in stream.chunks(name, data)]


def _types(chunks: list[Any]) -> list[str]:
    return [c if c == DONE else c["type"] for c in chunks]


def test_a_tools_interrupt_is_an_approval_request_and_ends_the_response() -> None:
    """The tool's call, then `tool-approval-request` for it (the approval id names the
    run's first interrupt), the `data-run` question, and `finish` (`tool-calls`, never
    `interrupted`, which would stop the SDK sending the answer) with `[DONE]`; nothing
    after it."""
    stream = UiMessageStream()
    chunks = _feed(stream, _asking_run(answered=True))
    _strict(chunks)
    assert stream.finished
    call = next(c for c in chunks if c != DONE and c["type"] == "tool-input-available"
                and c["toolName"] == "confirm")
    assert _types(chunks)[-4:] == ["tool-approval-request", "data-run", "finish", DONE]
    request, asked, finish = chunks[-4:-1]
    assert request == {"type": "tool-approval-request", "approvalId": approval_id(RUN, 1),
                       "toolCallId": call["toolCallId"], "approvalDescriptor": json.loads(ASK)}
    assert asked["data"]["event"] == "interrupt" and asked["data"]["detail"] == ASK
    assert finish["finishReason"] == "tool-calls"
    assert finish["messageMetadata"]["status"] == "interrupted"
    assert "tool-output-available" not in _types(chunks[chunks.index(call):])


def test_an_agents_own_interrupt_keeps_the_stream_open_with_the_data_run_only() -> None:
    """No tool call open when the message ended interrupted: no approval request, and
    the stream goes on (the native resume answers it)."""
    events = [e for e in _asking_run(answered=False)
              if not (e[0] == "step" and e[1]["name"] == "confirm")]
    stream = UiMessageStream()
    chunks = _feed(stream, events)
    assert "tool-approval-request" not in _types(chunks) and not stream.finished
    assert _types(chunks)[-1] == "data-run"


def test_the_answer_streams_what_follows_the_interrupt_into_the_same_tool_part() -> None:
    """`after_interrupt=1` (the approval's answer): a `start` naming the same message,
    then the resumed execution; the replayed `lookup` call and its source are not sent
    again, and `confirm`'s result completes the part the approval was asked in."""
    asked = _feed(UiMessageStream(), _asking_run(answered=False))
    call_id = next(c["toolCallId"] for c in asked if c != DONE and c["type"] ==
                   "tool-approval-request")
    stream = UiMessageStream(resumed=1, answers=[{"approved": True, "reason": None}],
                             after_interrupt=1)
    chunks = _feed(stream, _asking_run(answered=True))
    _strict(chunks)
    assert _types(chunks) == ["start", "data-run", "start-step", "text-start", "text-delta",
                              "tool-output-available", "text-delta", "text-end", "finish-step",
                              "data-run", "finish", DONE]
    assert chunks[0]["messageId"] == MESSAGE
    output = chunks[5]
    assert output["toolCallId"] == call_id
    assert output["output"] == {"content": {"answer": {"approved": True}}}
    assert chunks[3]["providerMetadata"]["threadline"]["execution"] == "exB"
    assert chunks[-2]["finishReason"] == "stop"


def test_a_replay_of_an_answered_approval_repeats_its_id_with_the_answer() -> None:
    """A reconnect after the answer (`resumed=1`): the same approval id, then
    `tool-approval-response` with the recorded answer, and the run to its end."""
    stream = UiMessageStream(resumed=1, answers=[{"approved": False, "reason": "no"}])
    chunks = _feed(stream, _asking_run(answered=True))
    _strict(chunks)
    request = next(c for c in chunks if c != DONE and c["type"] == "tool-approval-request")
    response = chunks[chunks.index(request) + 2]
    assert request["approvalId"] == approval_id(RUN, 1)
    assert response == {"type": "tool-approval-response", "approvalId": approval_id(RUN, 1),
                        "approved": False, "reason": "no"}
    assert _types(chunks)[-2:] == ["finish", DONE]
    confirm_ids = {c["toolCallId"] for c in chunks if c != DONE and "toolCallId" in c
                   and c["type"] != "tool-approval-response"}
    assert len(confirm_ids) == 2  # lookup and confirm, each once across both executions
    assert _types(chunks).count("source-url") == 1
    ended = _feed(UiMessageStream(resumed=None), _asking_run(answered=True))  # a run that ended
    assert _types(ended)[-2:] == ["finish", DONE]
    assert "tool-approval-response" not in _types(ended)


def test_an_answer_to_a_run_that_ended_before_that_interrupt_says_how_it_ended() -> None:
    """Skipping to interrupt 2, which never came: `start`, the end, `[DONE]`."""
    chunks = _feed(UiMessageStream(resumed=None, after_interrupt=2), _asking_run(answered=True))
    assert _types(chunks) == ["start", "data-run", "finish", DONE]


def test_a_different_call_at_a_known_position_is_a_new_tool_part() -> None:
    """A later execution calling another tool where the earlier one called `lookup`:
    not taken for that call."""
    stream = UiMessageStream(resumed=None)
    chunks = _feed(stream, [
        _ev("run_accepted", user_message_id="u1", detail=""),
        _ev("message_start", attempt=1, part_id="exA:message"),
        _ev("step", attempt=1, kind="tool_call", name="lookup", payload_json="{}"),
        _ev("message_start", attempt=1, part_id="exB:message"),
        _ev("step", attempt=1, kind="tool_call", name="search", payload_json="{}"),
        _ev("step", attempt=1, kind="tool_result", name="search", payload_json="1")])
    calls = [c for c in chunks if c["type"] == "tool-input-available"]
    outputs = [c for c in chunks if c["type"] == "tool-output-available"]
    assert len(calls) == 2 and calls[0]["toolCallId"] != calls[1]["toolCallId"]
    assert outputs[0]["toolCallId"] == calls[1]["toolCallId"]


def _assistant(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"id": MESSAGE, "role": "assistant", "parts": [{"type": "step-start"}, *parts]}


def _answered_part(approval: Any, state: str = "approval-responded") -> dict[str, Any]:
    return {"type": "dynamic-tool", "toolName": "confirm", "toolCallId": "c1", "state": state,
            "input": {}, "approval": approval}


def test_the_approval_answer_is_read_from_the_last_assistant_message() -> None:
    """The newest tool part in `approval-responded`: its id names the run and interrupt;
    the value is {approved, reason} (reason null when not given)."""
    done = _answered_part({"id": approval_id(RUN, 1), "approved": True}, "output-available")
    answer = approval_in(_assistant(done, _answered_part(
        {"id": approval_id("run:x", 2), "approved": False, "reason": "not now"})))
    assert (answer.run_id, answer.number, answer.tool_call_id) == ("run:x", 2, "c1")
    assert answer.value == {"approved": False, "reason": "not now"}
    plain = approval_in(_assistant(_answered_part({"id": approval_id(RUN, 1), "approved": True})))
    assert plain.value == {"approved": True, "reason": None}
    assert parse_approval_id(approval_id(RUN, 12)) == (RUN, 12)


def test_a_malformed_approval_answer_is_a_422() -> None:
    """No answered part, a bad approval object, an id not ours, a reason too long."""
    bad = [_assistant({"type": "text", "text": "hi"}),
           _assistant(_answered_part({"id": approval_id(RUN, 1), "approved": True},
                                     "approval-requested")),
           _assistant(_answered_part({"id": approval_id(RUN, 1), "approved": "yes"})),
           _assistant(_answered_part("approved")),
           _assistant(_answered_part({"id": "someone-else:1", "approved": True})),
           _assistant(_answered_part({"id": f"{RUN}:interrupt:0", "approved": True})),
           _assistant(_answered_part({"id": f"{RUN}:interrupt:x", "approved": True})),
           _assistant(_answered_part({"id": "\ud800:interrupt:1", "approved": True})),
           _assistant(_answered_part({"id": f"{'r' * 201}:interrupt:1", "approved": True})),
           _assistant(_answered_part({"id": approval_id(RUN, 1), "approved": True,
                                      "reason": "x" * 5000})),
           {"role": "assistant", "parts": "nope"}]
    for message in bad:
        with pytest.raises(Problem) as problem:
            approval_in(message)
        assert problem.value.status == 422, message
