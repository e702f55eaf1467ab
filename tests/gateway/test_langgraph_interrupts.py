"""Human in the loop on the LangGraph API, the pure part: the `interrupt` event as
`__interrupt__` (and the stream's end), the stream after a `command.resume`, and the
thread, state and run views of an interrupted run."""

from __future__ import annotations

from typing import Any

from gateway.adapters.langgraph.events import (
    Part,
    StateValues,
    Translator,
    interrupt_id,
    lg_interrupt,
    task_id,
)
from gateway.adapters.langgraph.views import (
    interrupted_run,
    pending_interrupt,
    resumed_interrupts,
    run_json,
    state_tasks,
    thread_json,
    thread_status,
)
from streams.core.domain import AttemptDispatched, ResumeRun
from streams.core.thread import apply, decide, initial_state
from tests.streams.test_interrupts import INTERRUPTED
from tests.streams.test_thread import POLICY, RUN1, TENANT, T

RUN, MSG = "run-1", "answer-1"
ASKED = {"question": "ok?"}


def _ev(event: str, part_id: str = "lifecycle", **extra: Any) -> tuple[str, dict[str, Any]]:
    return event, {"run_id": RUN, "message_id": MSG, "attempt": 1, "part_id": part_id, **extra}


# exA streams "Step", asks; resumed, exB replays "Step" and ends " done".
EVENTS = [
    _ev("run_accepted"), _ev("attempt_dispatched"), _ev("message_start", "exA:message"),
    _ev("text_delta", "exA:text:0", delta="Step"),
    _ev("message_end", "exA:message", finish_reason="interrupted"),
    _ev("interrupt", detail='{"question": "ok?"}'),
    _ev("attempt_dispatched"), _ev("message_start", "exB:message"),
    _ev("text_delta", "exB:text:0", delta="Step"), _ev("text_delta", "exB:text:0", delta=" done"),
    _ev("message_end", "exB:message", finish_reason="stop"),
    _ev("run_completed", message={"message_id": MSG, "text": "Step done", "steps": [],
                                  "citations": []}),
    ("done", "[DONE]"),
]
INTERRUPT = {"value": ASKED, "id": interrupt_id(RUN, 1)}


def _parts(translator: Translator) -> list[Part]:
    return [p for name, data in EVENTS for p in translator.translate(name, data)]


def test_a_new_interrupt_ends_the_stream_with_interrupt() -> None:
    """updates: `{"__interrupt__": [...]}` then `end`; nothing after, however much follows."""
    translator = Translator(frozenset({"updates", "messages"}), "t", "a")
    parts = _parts(translator)
    assert [p.event for p in parts][-3:] == ["messages/partial", "updates", "end"]
    assert parts[-2].data == {"__interrupt__": [INTERRUPT]}
    assert parts[-3].data[0]["content"] == "Step"
    assert translator.stopped and translator.interrupt == INTERRUPT
    assert translator.translate(*_ev("run_completed", message=None)) == []


def test_values_carry_the_interrupt_and_any_mode_gets_it() -> None:
    """values: the state with `__interrupt__` (filled by the handler); a mode with neither
    values nor updates still gets the `updates` part."""
    parts = _parts(Translator(frozenset({"values"}), "t", "a"))
    assert parts[-2:] == [Part("values", StateValues(INTERRUPT)), Part("end", None)]
    assert [p.event for p in parts] == ["values", "values", "end"]
    tuples = _parts(Translator(frozenset({"messages-tuple"}), "t", "a"))
    assert [p.event for p in tuples] == ["messages", "updates", "end"]


def test_after_a_resume_the_stream_has_only_what_follows_the_interrupt() -> None:
    """after_interrupt: no part of the events up to the interrupt resumed; the next
    execution's partials restart the message and end on the stored answer."""
    parts = _parts(Translator(frozenset({"messages", "updates"}), "t", "a", resumed=1,
                              after_interrupt=1))
    assert [p.event for p in parts] == ["messages/metadata", "messages/partial",
                                        "messages/partial", "messages/partial",
                                        "messages/complete", "updates", "end"]
    shown = [p.data[0]["content"] for p in parts if p.event.startswith("messages/")
             and p.event != "messages/metadata"]
    assert shown == ["", "Step", "Step done", "Step done"]
    assert "__interrupt__" not in str(parts)


def test_an_interrupt_already_resumed_or_of_an_ended_run_does_not_stop_it() -> None:
    """resumed=1 (a join after the resume) or None (the run ended): the stream goes on."""
    for resumed in (1, None):
        translator = Translator(frozenset({"updates"}), "t", "a", resumed=resumed)
        parts = _parts(translator)
        assert not translator.stopped and translator.interrupts == 1
        assert [p.event for p in parts] == ["updates", "end"]
        assert parts[0].data["agent"]["messages"][0]["content"] == "Step done"


def test_an_interrupt_is_its_payload_and_a_stable_id() -> None:
    """The value is the payload parsed; ids are stable per run and interrupt, and differ."""
    assert lg_interrupt(RUN, 2, '[1, "x"]') == {"value": [1, "x"], "id": interrupt_id(RUN, 2)}
    assert lg_interrupt(RUN, 1, "not json")["value"] == "not json"
    assert interrupt_id(RUN, 1) == interrupt_id(RUN, 1) != interrupt_id(RUN, 2)
    assert task_id(RUN, 1) != task_id("run-2", 1)


def test_the_views_of_an_interrupted_run_and_of_it_resumed() -> None:
    """Thread `interrupted` with its interrupts by task, state tasks, run `interrupted`;
    resumed: busy, no tasks, run pending, one interrupt resumed."""
    state = apply(initial_state(), INTERRUPTED, POLICY)
    assert state is not None
    asked = {"value": ASKED, "id": interrupt_id(RUN1, 1)}
    assert interrupted_run(state) == RUN1 and resumed_interrupts(state, RUN1) == 0
    assert pending_interrupt(state) == (task_id(RUN1, 1), asked)
    assert thread_status(state) == "interrupted"
    assert thread_json(state, None)["interrupts"] == {task_id(RUN1, 1): [asked]}
    [task] = state_tasks(state)
    assert task["id"] == task_id(RUN1, 1) and task["interrupts"] == [asked]
    assert run_json(state, RUN1, state.active_run.status if state.active_run else None,
                    0)["status"] == "interrupted"
    assert run_json(state, "other-run", None, 0)["status"] == "pending"
    events = decide(state, ResumeRun(T, TENANT, RUN1, '"yes"', 5_000), POLICY)
    assert isinstance(events[-1], AttemptDispatched)
    resumed = apply(state, events, POLICY)
    assert resumed is not None
    assert interrupted_run(resumed) is None and pending_interrupt(resumed) is None
    assert thread_status(resumed) == "busy" and state_tasks(resumed) == []
    assert thread_json(resumed, None)["interrupts"] == {}
    assert resumed_interrupts(resumed, RUN1) == 1 and resumed_interrupts(resumed, "x") == 0
    assert run_json(resumed, RUN1, resumed.active_run.status if resumed.active_run else None,
                    0)["status"] == "pending"
