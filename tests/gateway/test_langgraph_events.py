"""The pure mapping of Threadline events onto LangGraph stream parts."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.adapters.langgraph.events import VALUES, Part, Translator, modes_from, modes_from_query
from gateway.adapters.langgraph.views import conversation, internal_thread_id, lg_thread_id
from streams.core.domain import StoredMessage, ThreadState
from streams.core.records import MessageRecord

RUN, MSG = "run-1", "answer-1"


def _ev(event: str, part_id: str = "lifecycle", attempt: int = 1, **extra: Any) -> \
        tuple[str, dict[str, Any]]:
    return event, {"run_id": RUN, "message_id": MSG, "attempt": attempt, "part_id": part_id,
                  **extra}


# A first execution streams "Hel", dies; the second streams "Hi" and completes.
RUN_EVENTS = [
    _ev("run_accepted"), _ev("attempt_dispatched"),
    _ev("message_start", "exA:message"), _ev("text_start", "exA:text:0"),
    _ev("text_delta", "exA:text:0", delta="He"), _ev("text_delta", "exA:text:0", delta="l"),
    _ev("message_start", "exB:message"), _ev("text_start", "exB:text:0"),
    _ev("text_delta", "exB:text:0", delta="Hi"), _ev("text_end", "exB:text:0", text="Hi"),
    _ev("step", "exB:step:0", kind="tool_call", name="search", payload_json="{}"),
    _ev("message_end", "exB:message", finish_reason="stop"),
    _ev("run_completed", message={"message_id": MSG, "text": "Hi", "steps": [],
                                  "citations": []}),
    ("done", "[DONE]"),
]


def _run(*modes: str) -> list[Part]:
    translator = Translator(frozenset(modes), "t-1", "asst")
    return [p for name, data in RUN_EVENTS for p in translator.translate(name, data)]


def test_stream_modes() -> None:
    """A name or a list; values by default; an unknown mode is named."""
    assert modes_from(None) == {"values"}
    assert modes_from("messages-tuple") == {"messages-tuple"}
    assert modes_from(["values", "updates"]) == {"values", "updates"}
    with pytest.raises(ValueError, match="debug"):
        modes_from(["values", "debug"])


def test_messages_mode_drops_a_superseded_attempt() -> None:
    """The second execution's empty partial replaces the first's text; complete is stored."""
    parts = _run("messages")
    shown = [p.data[0]["content"] for p in parts if p.event.startswith("messages/p")]
    assert shown == ["", "He", "Hel", "", "Hi"]
    assert [p.event for p in parts].count("messages/metadata") == 2
    assert parts[-2].event == "messages/complete" and parts[-2].data[0]["content"] == "Hi"
    assert parts[-1] == Part("end", None)


def test_tuple_chunks_name_their_execution() -> None:
    """Chunks only add up, so each carries its execution: a new one restarts the text."""
    chunks = [p.data for p in _run("messages-tuple") if p.event == "messages"]
    assert [(c["content"], m["execution"]) for c, m in chunks] == \
        [("He", "exA"), ("l", "exA"), ("Hi", "exB")]
    assert all(c["type"] == "AIMessageChunk" and c["id"] == MSG for c, _ in chunks)


def test_values_updates_custom_and_failure() -> None:
    """values at the start and the end (filled by the handler), updates once, steps as custom."""
    parts = _run("values", "updates", "custom")
    assert [p.event for p in parts] == ["values", "custom", "updates", "values", "end"]
    assert parts[0].data is VALUES and parts[3].data is VALUES
    assert parts[1].data["type"] == "step" and parts[1].data["name"] == "search"
    failed = Translator(frozenset({"values"}), "t", "a").translate(
        *_ev("run_failed", detail="boom"))
    assert [p.event for p in failed] == ["values", "error"]
    assert failed[1].data == {"error": "RunFailed", "message": "boom"}


def test_thread_ids_are_per_tenant() -> None:
    """The same client id names two threads for two tenants, and is given back."""
    assert internal_thread_id("a", "x") != internal_thread_id("b", "x")
    state = ThreadState(internal_thread_id("a", "x"), "a", "x", 0)
    assert lg_thread_id(state) == "x"
    other = ThreadState("11111111-1111-4111-8111-111111111111", "a", "x", 0)
    assert lg_thread_id(other) == other.thread_id  # a title is not an id by itself


def _record(seq: int, role: str, run: str, message_id: str = "") -> MessageRecord:
    return MessageRecord(seq, StoredMessage(message_id or f"m{seq}", role, f"text {seq}", run,
                                            1_000 + seq))


def test_the_conversation_puts_each_answer_after_its_question() -> None:
    """A question queued during a run is stored before that run's answer; the thread
    shows question, answer, question, answer, and leaves a still-queued one out."""
    history = [_record(0, "user", "r1"), _record(1, "user", "r2"), _record(2, "assistant", "r1"),
               _record(3, "user", "r3", "q3"), _record(4, "assistant", "r2")]
    shown = conversation(history, queued={"q3"})
    assert [r.seq for r in shown] == [0, 2, 1, 4]
    assert [r.seq for r in conversation(history, queued=())] == [0, 2, 1, 4, 3]
    # an answer whose question is on an older page keeps its place
    assert [r.seq for r in conversation(history[2:], queued=())] == [2, 3, 4]


def test_stream_modes_in_a_query_string() -> None:
    """Repeated parameters (the Python SDK) or one JSON list (the JavaScript SDK's
    array, as `JSON.stringify` writes it); anything else that starts a list is refused."""
    assert modes_from_query([]) is None
    assert modes_from_query(["values"]) == ["values"]
    assert modes_from_query(["values", "updates"]) == ["values", "updates"]
    assert modes_from_query(['["messages-tuple","values"]']) == ["messages-tuple", "values"]
    assert modes_from(modes_from_query(['["messages-tuple"]'])) == {"messages-tuple"}
    for bad in ("[messages", '["values", 3]', "[]x"):
        with pytest.raises(ValueError):
            modes_from_query([bad])
