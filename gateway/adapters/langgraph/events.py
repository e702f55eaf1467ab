"""Threadline's events as LangGraph Platform stream parts: the pure mapping.

Pure: no I/O. `gateway.adapters.langgraph` reads a run's events as Threadline serves them
(`/v1/runs/{run_id}/events`) and hands each, in order, to `Translator.translate`,
which answers the LangGraph SSE parts it becomes under the stream modes asked for.
A `values` part needs the thread's state, which only the handler can read: it comes
back as `VALUES` and the handler fills it in (`Part.data is VALUES`).

| Threadline event | `messages` | `messages-tuple` | `updates` | `custom` | other |
|---|---|---|---|---|---|
| `run_accepted` | | | | | `values` (state with the user message) |
| `message_start` | `messages/metadata`, `messages/partial` (empty) | | | | |
| `text_delta` | `messages/partial` (text so far) | `messages` (chunk, metadata) | | | |
| `step`, `citations` | | | | `{"type": "step"...}` | |
| `run_completed` | `messages/complete` (stored answer) | | `{"agent": {"messages": [..]}}` | | `values` |
| `run_failed` | | | | | `values`, `error` |
| `run_cancelled` | | | | | `values` |
| `interrupt` (a new one) | | | `{"__interrupt__": [..]}` | | `values` with `__interrupt__`, `end` |
| `done` | | | | | `end` |

Human in the loop: the `interrupt` event of an interrupt not yet resumed when the
stream began (`Translator.resumed`) becomes `{"__interrupt__": [{"value", "id"}]}`,
as an `updates` part (also when neither `updates` nor `values` is asked) and in the
`values` (`VALUES.interrupt`), then `end`: the stream stops there (`stopped`) while
the run waits. A stream after a `command.resume` drops the parts of every event up
to the interrupt it resumed (`after_interrupt`), so the client gets only what
follows; its translator still folds them, so partials stay whole.

The others (`attempt_dispatched`, `text_start`, `text_end`, `message_end`,
`retry_scheduled`) become nothing. A superseded attempt: its replacement begins
with a new `message_start` (the same message id), which in `messages` mode sends a
`messages/partial` with empty content, so a client that shows the latest partial
drops the old text; `messages/complete` and `values` carry the stored answer. In
`messages-tuple` mode chunks only add up, so each chunk's metadata names its
`execution` and `attempt`: a chunk of a new execution restarts the message.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["GRAPH_ID", "MODES", "NODE", "VALUES", "Part", "StateValues", "Translator",
           "ai_message", "human_message", "interrupt_id", "lg_interrupt", "modes_from",
           "modes_from_query", "task_id"]

GRAPH_ID: Final = "agent"
NODE: Final = "agent"  # the one node the runs appear to run
MODES: Final = frozenset({"values", "messages", "messages-tuple", "updates", "custom"})


@dataclass(frozen=True, slots=True)
class StateValues:
    """Stands for the thread's state, filled in by the handler; with `interrupt`, the
    state carries `__interrupt__: [interrupt]`."""

    interrupt: dict[str, Any] | None = None


VALUES: Final = StateValues()
_TASKS: Final = uuid.UUID("9a6f2f3e-5d0c-5b7e-9a51-4c1b0f6d2a10")


def interrupt_id(run_id: str, number: int) -> str:
    """The id of the run's `number`th interrupt (from 1): stable, a hex string."""
    return uuid.uuid5(_TASKS, f"interrupt:{run_id}:{number}").hex


def task_id(run_id: str, number: int) -> str:
    """The id of the task the run's `number`th interrupt stands in."""
    return str(uuid.uuid5(_TASKS, f"task:{run_id}:{number}"))


def lg_interrupt(run_id: str, number: int, payload_json: str) -> dict[str, Any]:
    """A LangGraph Interrupt: the agent's payload (JSON text) as `value`, and its id."""
    try:
        value = json.loads(payload_json)
    except ValueError:
        value = payload_json
    return {"value": value, "id": interrupt_id(run_id, number)}


@dataclass(frozen=True, slots=True)
class Part:
    """One LangGraph SSE part: its event name and JSON data (or `VALUES`)."""

    event: str
    data: Any


def modes_from(raw: object, default: str = "values") -> frozenset[str]:
    """The stream modes of a request (`stream_mode`: a name or a list); ValueError names
    any mode this API does not serve."""
    if raw is None or raw == [] or raw == "":
        return frozenset({default})
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError("stream_mode must be a string or a list of strings")
    unknown = sorted(set(names) - MODES)
    if unknown:
        raise ValueError(f"stream_mode {', '.join(unknown)} is not supported (supported: "
                         f"{', '.join(sorted(MODES))})")
    return frozenset(names)


def modes_from_query(values: list[str]) -> list[str] | None:
    """The stream modes of a query string: repeated `stream_mode=` parameters (the
    Python SDK), or one holding a JSON list (the JavaScript SDK sends an array as
    `JSON.stringify`'s text); None if there are none."""
    names: list[str] = []
    for value in values:
        if value.startswith("["):
            try:
                parsed = json.loads(value)
            except ValueError:
                raise ValueError("stream_mode is neither a mode nor a JSON list of modes") from None
            if not isinstance(parsed, list) or not all(isinstance(n, str) for n in parsed):
                raise ValueError("stream_mode must be a string or a list of strings")
            names += parsed
        else:
            names.append(value)
    return names or None


def human_message(message_id: str, text: str) -> dict[str, Any]:
    """A user message as LangChain serializes a HumanMessage."""
    return {"type": "human", "content": text, "id": message_id, "name": None,
            "additional_kwargs": {}, "response_metadata": {}, "example": False}


def ai_message(message_id: str, text: str, *, steps: list[dict[str, Any]] | None = None,
               citations: list[dict[str, Any]] | None = None,
               chunk: bool = False) -> dict[str, Any]:
    """An assistant message as LangChain serializes an AIMessage (or AIMessageChunk)."""
    kwargs: dict[str, Any] = {}
    if steps:
        kwargs["threadline_steps"] = steps
    return {"type": "AIMessageChunk" if chunk else "ai", "content": text, "id": message_id,
            "name": None, "additional_kwargs": kwargs,
            "response_metadata": {"citations": citations} if citations else {},
            "tool_calls": [], "invalid_tool_calls": [], "usage_metadata": None,
            "example": False}


@dataclass
class Translator:
    """Turns one run's Threadline events, in order, into LangGraph parts."""

    modes: frozenset[str]
    thread_id: str  # as the LangGraph client names it
    assistant_id: str
    text: dict[str, str] = field(default_factory=dict)  # answer text so far, by message
    execution: dict[str, str] = field(default_factory=dict)  # current execution, by message
    # Interrupts resumed when the stream began: a later one stops it. None: none stops it.
    resumed: int | None = 0
    after_interrupt: int = 0  # drop every part up to this interrupt (a command.resume)
    interrupts: int = 0  # interrupt events seen
    interrupt: dict[str, Any] | None = None  # the one the stream stopped at
    stopped: bool = False

    def _metadata(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"run_id": data.get("run_id"), "thread_id": self.thread_id,
                "assistant_id": self.assistant_id, "graph_id": GRAPH_ID,
                "langgraph_node": NODE, "attempt": data.get("attempt"),
                "execution": self.execution.get(data.get("message_id") or "")}

    def translate(self, name: str, data: Any) -> list[Part]:
        """The parts one Threadline event (name, parsed JSON data) becomes; none once
        stopped, nor up to the interrupt `after_interrupt`."""
        if self.stopped:
            return []
        parts = self._translate(name, data)
        return parts if self.interrupts >= self.after_interrupt else []

    def _translate(self, name: str, data: Any) -> list[Part]:
        if name == "done":
            return [Part("end", None)]
        if not isinstance(data, dict):
            return []
        message_id = str(data.get("message_id") or "")
        parts: list[Part] = []
        modes = self.modes
        if name == "run_accepted" and "values" in modes:
            parts.append(Part("values", VALUES))
        elif name == "message_start":
            self.text[message_id] = ""
            self.execution[message_id] = str(data.get("part_id", "")).split(":", 1)[0]
            if "messages" in modes:
                parts.append(Part("messages/metadata",
                                  {message_id: {"metadata": self._metadata(data)}}))
                parts.append(Part("messages/partial", [ai_message(message_id, "")]))
        elif name == "text_delta":
            delta = str(data.get("delta", ""))
            self.text[message_id] = self.text.get(message_id, "") + delta
            if "messages" in modes:
                parts.append(Part("messages/partial",
                                  [ai_message(message_id, self.text[message_id])]))
            if "messages-tuple" in modes:
                parts.append(Part("messages", [ai_message(message_id, delta, chunk=True),
                                               self._metadata(data)]))
        elif name in ("step", "citations") and "custom" in modes:
            custom = {k: v for k, v in data.items()
                      if k in ("kind", "name", "payload_json", "citations")}
            parts.append(Part("custom", {"type": name, "message_id": message_id, **custom}))
        elif name == "run_completed":
            answer = _stored_answer(data)
            if "messages" in modes and answer is not None:
                parts.append(Part("messages/complete", [answer]))
            if "updates" in modes and answer is not None:
                parts.append(Part("updates", {NODE: {"messages": [answer]}}))
            if "values" in modes:
                parts.append(Part("values", VALUES))
        elif name == "run_failed":
            if "values" in modes:
                parts.append(Part("values", VALUES))
            parts.append(Part("error", {"error": "RunFailed",
                                        "message": str(data.get("detail") or "the run failed")}))
        elif name == "run_cancelled" and "values" in modes:
            parts.append(Part("values", VALUES))
        elif name == "interrupt":
            self.interrupts += 1
            if self.resumed is not None and self.interrupts > self.resumed:
                parts += self._stop(lg_interrupt(str(data.get("run_id", "")), self.interrupts,
                                                 str(data.get("detail", "null"))))
        return parts

    def _stop(self, interrupt: dict[str, Any]) -> list[Part]:
        self.interrupt, self.stopped = interrupt, True
        parts = []
        if "updates" in self.modes or "values" not in self.modes:
            parts.append(Part("updates", {"__interrupt__": [interrupt]}))
        if "values" in self.modes:
            parts.append(Part("values", StateValues(interrupt)))
        return [*parts, Part("end", None)]


def _stored_answer(data: dict[str, Any]) -> dict[str, Any] | None:
    message = data.get("message")
    if not isinstance(message, dict):
        return None
    return ai_message(str(message.get("message_id")), str(message.get("text", "")),
                      steps=message.get("steps") or None,
                      citations=message.get("citations") or None)
