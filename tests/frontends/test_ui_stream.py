"""The UI message stream mapping alone: each of our events' chunks, every chunk within
the SDK's strict field list, and a run with a superseded attempt."""

from __future__ import annotations

import json
from typing import Any

from gateway.adapters.ai_sdk.ui_stream import CHUNK_FIELDS, DONE, UiMessageStream, chunk_frame, ui_message
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
