"""Our SSE events as the Vercel AI SDK's UI message stream (`ai` v7), and stored
messages as its `UIMessage`s.

Pure: no I/O. `UiMessageStream` turns one run's events, in order, into the SDK's
chunks; `gateway.adapters.ai_sdk.chat` serves them. The SDK checks every chunk against
its schema, so each chunk here carries only fields its type has (`CHUNK_FIELDS`,
copied from `ai`'s `uiMessageChunkSchema`).

| our event | chunks |
|---|---|
| `run_accepted` | `start` (`messageId`: the answer's id), `data-run` |
| `attempt_dispatched` | `data-run` |
| `message_start` | (`finish-step` of an unfinished attempt), `start-step` |
| `text_start` / `text_delta` / `text_end` | `text-start` / `text-delta` / `text-end` |
| `step` (`tool_call` / `tool_result`) | `tool-input-available` / `tool-output-available` |
| `citations` | `source-url`, one a citation |
| `message_end` | `finish-step` |
| `retry_scheduled` | (`finish-step`), `data-run` with the reason |
| `run_completed` | `data-run`, `finish` |
| `run_failed` | `data-run`, `error`, `finish` (`finishReason: "error"`) |
| `run_cancelled` | `data-run`, `abort` |
| `interrupt` | (`finish-step`), `data-run` with the agent's question (human in the loop) |
| `interrupt` in a tool | also `tool-approval-request` (the call); if it waits, `finish`, `[DONE]` |
| `done` | `[DONE]` |

`data-run` parts share the run's id, so the SDK keeps one part a message with the
run's latest state (`onData` sees each). A superseded attempt's text stays in the
message as the SDK has no chunk to take text back: every text part carries
`providerMetadata.threadline.attempt`, and the `finish` chunk's `messageMetadata`
names the attempt that answered, so a client shows that attempt's parts only. A run
resumed after an interrupt goes on in the same attempt with a new execution, which
replays the journaled turns' text: each text part also carries
`providerMetadata.threadline.execution`, and a client shows the text parts of the
newest execution only (docs/clients.md).
Tool parts are `dynamic` (the client declares no tools) and `providerExecuted`. A
call's id is its position in its execution (`<answer>:<attempt>:tool:<k>`), so a
later execution of the attempt repeating it (same name and input) names the same part:
its input is not sent again, and its result completes that part.

Tool approval: an interrupt raised inside a tool (the message ends `interrupted` with
that tool's call open) is the SDK's tool approval: a `tool-approval-request` for the
call, with `approval_id(run_id, n)` for the run's n-th interrupt (the same on every
replay) and the agent's payload as `approvalDescriptor`. An interrupt the stream waits
on (`n > resumed`) then ends the stream (`finish` with `tool-calls`, `[DONE]`): the
SDK answers only once its response is over (`addToolApprovalResponse`, then
`sendAutomaticallyWhen`). An answered one (on a replay) is followed by
`tool-approval-response` when its value is known (`answers`). `after_interrupt=n` (the
answer to approval n) sends nothing up to that interrupt, then `start` and the rest:
the run goes on in the message the client has.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.adapters.ai_sdk.approvals import approval_id
from streams.core.records import MessageRecord

__all__ = ["CHUNK_FIELDS", "DONE", "UI_STREAM_HEADERS", "UiMessageStream", "chunk_frame",
           "ui_message"]

UI_STREAM_HEADERS = {"x-vercel-ai-ui-message-stream": "v1"}
DONE = "[DONE]"

# Each chunk type and the fields it may carry (`ai@7.0.173` `uiMessageChunkSchema`);
# the tests check every chunk made against this table.
CHUNK_FIELDS: dict[str, frozenset[str]] = {
    "start": frozenset({"type", "messageId", "messageMetadata"}),
    "start-step": frozenset({"type"}),
    "finish-step": frozenset({"type"}),
    "text-start": frozenset({"type", "id", "providerMetadata"}),
    "text-delta": frozenset({"type", "id", "delta", "providerMetadata"}),
    "text-end": frozenset({"type", "id", "citations", "providerMetadata"}),
    "source-url": frozenset({"type", "sourceId", "url", "title", "providerMetadata"}),
    "tool-input-available": frozenset({"type", "toolCallId", "toolName", "input",
                                       "providerExecuted", "providerMetadata", "toolMetadata",
                                       "dynamic", "title"}),
    "tool-output-available": frozenset({"type", "toolCallId", "output", "providerExecuted",
                                        "providerMetadata", "toolMetadata", "dynamic",
                                        "preliminary"}),
    "tool-approval-request": frozenset({"type", "approvalId", "toolCallId",
                                        "approvalDescriptor", "inputSchemaInput", "reason",
                                        "isAutomatic", "signature"}),
    "tool-approval-response": frozenset({"type", "approvalId", "approved", "reason",
                                         "providerExecuted", "providerMetadata"}),
    "error": frozenset({"type", "errorText"}),
    "abort": frozenset({"type", "reason"}),
    "finish": frozenset({"type", "finishReason", "messageMetadata"}),
    "message-metadata": frozenset({"type", "messageMetadata"}),
    "data-*": frozenset({"type", "id", "data", "transient"}),
}
# `ai@7`'s finish reasons but `interrupted`: a message that finished `interrupted` is
# never sent on automatically, so an approval answered in it would not be sent.
FINISH_REASONS = frozenset({"stop", "length", "content-filter", "tool-calls", "error", "other"})
APPROVAL_FINISH = "tool-calls"  # a response that ends at a tool approval request
_ENDS = frozenset({"run_completed", "run_failed", "run_cancelled", "done"})

Chunk = dict[str, Any]


def chunk_frame(chunk: Chunk | str) -> bytes:
    """One chunk as an SSE frame (`data:` only: the SDK reads no event name or id)."""
    data = chunk if isinstance(chunk, str) else json.dumps(chunk, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


@dataclass(slots=True)
class _Call:
    name: str
    input_json: str
    output_sent: bool = False


class UiMessageStream:
    """The chunks of one run's events, fed in order (`chunks(name, data)`).

    `resumed`: how many of the run's interrupts were answered when the stream began
    (None: all of them, the run ended); a tool's interrupt past it ends the stream.
    `answers`: the values they were answered with, in order, as far as known.
    `after_interrupt`: send nothing up to the run's interrupt of that number."""

    def __init__(self, *, resumed: int | None = 0, answers: Sequence[Any] = (),
                 after_interrupt: int = 0) -> None:
        self.resumed = None if resumed is None else max(resumed, after_interrupt)
        self.answers = list(answers)
        self.after_interrupt = after_interrupt
        self.finished = False  # `[DONE]` went out: nothing more is sent
        self.owe_start = False  # the first chunk after `after_interrupt` is a `start`
        self.message_id = ""
        self.run_id = ""
        self.thread_id = ""
        self.attempt = 0
        self.execution = ""  # the current execution (a resumed interrupt starts a new one)
        self.step_open = False
        self.text_id: str | None = None
        self.texts = 0  # text parts made, for unique ids
        self.calls_in_execution = 0  # tool calls of the current execution: their ids
        self.calls: dict[str, _Call] = {}  # every tool call sent, by id
        self.open_calls: list[tuple[str, str]] = []  # (tool name, call id) awaiting a result
        self.asking_call: str | None = None  # the call open when its message ended interrupted
        self.sources: set[tuple[int, str]] = set()  # (attempt, url) of the sources sent
        self.interrupts = 0
        self.finish_reason = "stop"

    @property
    def skipping(self) -> bool:
        """Whether chunks are still held back (`after_interrupt` not reached)."""
        return self.interrupts < self.after_interrupt

    def chunks(self, name: str, data: dict[str, Any]) -> list[Chunk | str]:
        """The chunks of one of our events (`name`, its JSON `data`)."""
        if self.finished:
            return []
        held = self.skipping
        out = self._chunks(name, data)
        if name == "done":
            self.finished = True
        if held:
            if not self.skipping:  # the interrupt answered: what follows it goes out
                self.owe_start = True
                return []
            if name not in _ENDS:
                return []
            # The run ended short of that interrupt: say how it ended.
            out = [c for c in out if isinstance(c, str) or
                   c["type"] not in ("text-end", "finish-step")]
            self.owe_start = name != "done"
        if self.owe_start and out:
            self.owe_start = False
            out.insert(0, self._start())
        return out

    def _chunks(self, name: str, data: dict[str, Any]) -> list[Chunk | str]:
        if name == "done":
            return [DONE]
        out: list[Chunk | str] = []
        if name == "run_accepted":
            self.message_id, self.run_id = data["message_id"], data["run_id"]
            self.thread_id = data["thread_id"]
            out.append(self._start())
        elif name == "message_start":
            out += self._close_step()
            self.attempt = int(data.get("attempt", self.attempt))
            self.execution = str(data.get("part_id", "")).split(":", 1)[0]
            self.calls_in_execution = 0
            self.step_open = True
            out.append({"type": "start-step"})
        elif name == "text_start":
            out += self._text_start()
        elif name == "text_delta":
            if self.text_id is None:
                out += self._text_start()
            out.append({"type": "text-delta", "id": self.text_id, "delta": data["delta"]})
        elif name == "text_end":
            out += self._text_end()
        elif name == "step":
            out += self._step(data)
        elif name == "citations":
            out += self._sources(data.get("citations", []))
        elif name == "message_end":
            reason = data.get("finish_reason") or "stop"
            if reason == "interrupted" and self.open_calls:
                self.asking_call = self.open_calls[-1][1]
            self.finish_reason = reason if reason in FINISH_REASONS else "other"
            out += self._close_step()
        if name in ("attempt_dispatched", "retry_scheduled", "run_accepted", "run_completed",
                    "run_failed", "run_cancelled", "interrupt"):
            if name != "run_accepted":
                out += self._close_step()
            if name == "interrupt":
                return out + self._interrupt(data)
            out.append(self._run_part(name, data))
        if name == "run_completed":
            out.append({"type": "finish", "finishReason": self.finish_reason,
                        "messageMetadata": self._metadata(status="completed")})
        elif name == "run_failed":
            out.append({"type": "error", "errorText": data.get("detail") or "the run failed"})
            out.append({"type": "finish", "finishReason": "error",
                        "messageMetadata": self._metadata(status="failed")})
        elif name == "run_cancelled":
            out.append({"type": "abort"})
        return out

    def _start(self) -> Chunk:
        return {"type": "start", "messageId": self.message_id,
                "messageMetadata": self._metadata()}

    def _interrupt(self, data: dict[str, Any]) -> list[Chunk | str]:
        self.interrupts += 1
        call, self.asking_call = self.asking_call, None
        if call is None:  # the agent asked, not a tool: the data-run part only
            return [self._run_part("interrupt", data)]
        approval = approval_id(self.run_id or str(data.get("run_id", "")), self.interrupts)
        out: list[Chunk | str] = [
            {"type": "tool-approval-request", "approvalId": approval, "toolCallId": call,
             "approvalDescriptor": _json_or_text(str(data.get("detail", "null")))},
            self._run_part("interrupt", data)]
        if self.resumed is not None and self.interrupts > self.resumed:  # it waits
            self.finished = True
            return [*out, {"type": "finish", "finishReason": APPROVAL_FINISH,
                           "messageMetadata": self._metadata(status="interrupted")}, DONE]
        answer = self.answers[self.interrupts - 1] if self.interrupts <= len(self.answers) \
            else None
        if isinstance(answer, dict) and isinstance(answer.get("approved"), bool):
            response: Chunk = {"type": "tool-approval-response", "approvalId": approval,
                               "approved": answer["approved"]}
            if isinstance(answer.get("reason"), str):
                response["reason"] = answer["reason"]
            out.append(response)
        return out

    def _metadata(self, status: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"thread_id": self.thread_id, "run_id": self.run_id}
        if status is not None:
            meta |= {"status": status, "attempt": self.attempt}
        return meta

    def _run_part(self, name: str, data: dict[str, Any]) -> Chunk:
        return {"type": "data-run", "id": self.run_id or data.get("run_id", ""),
                "data": {"event": name, "run_id": data.get("run_id", self.run_id),
                         "attempt": data.get("attempt", 0), "detail": data.get("detail", "")}}

    def _sources(self, citations: list[dict[str, Any]]) -> list[Chunk | str]:
        out: list[Chunk | str] = []
        for citation in citations:
            key = (self.attempt, str(citation["url"]))
            if key in self.sources:  # a later execution citing it again
                continue
            self.sources.add(key)
            source: Chunk = {"type": "source-url",
                             "sourceId": f"{self.message_id}:{self.attempt}:source:"
                                         f"{len(self.sources)}",
                             "url": citation["url"]}
            if citation.get("title"):
                source["title"] = citation["title"]
            out.append(source)
        return out

    def _text_start(self) -> list[Chunk | str]:
        out = self._text_end()
        if not self.step_open:  # output without its message_start: cannot happen in order
            self.step_open = True
            out.append({"type": "start-step"})
        self.texts += 1
        self.text_id = f"{self.message_id}:{self.attempt}:text:{self.texts}"
        out.append({"type": "text-start", "id": self.text_id,
                    "providerMetadata": {"threadline": {"attempt": self.attempt,
                                                        "execution": self.execution}}})
        return out

    def _text_end(self) -> list[Chunk | str]:
        if self.text_id is None:
            return []
        text_id, self.text_id = self.text_id, None
        return [{"type": "text-end", "id": text_id}]

    def _close_step(self) -> list[Chunk | str]:
        out = self._text_end()
        self.open_calls.clear()
        if self.step_open:
            self.step_open = False
            out.append({"type": "finish-step"})
        return out

    def _step(self, data: dict[str, Any]) -> list[Chunk | str]:
        name, raw = str(data.get("name", "")), str(data.get("payload_json", ""))
        payload = _json_or_text(raw)
        if data.get("kind") == "tool_result":
            found = next((c for c in self.open_calls if c[0] == name), None)
            if found is not None:
                self.open_calls.remove(found)
                return self._output(found[1], payload)
            # A result without its call: show it as a call that already has it.
        self.calls_in_execution += 1
        call_id = f"{self.message_id}:{self.attempt}:tool:{self.calls_in_execution}"
        known = self.calls.get(call_id)
        if known is not None and (known.name, known.input_json) != (name, raw):
            call_id = f"{call_id}:{self.execution}"  # another call at that position
            known = self.calls.get(call_id)
        out: list[Chunk | str] = []
        if known is None:
            self.calls[call_id] = _Call(name, raw)
            out.append({"type": "tool-input-available", "toolCallId": call_id,
                        "toolName": name, "input": payload, "providerExecuted": True,
                        "dynamic": True})
        if data.get("kind") == "tool_result":
            out += self._output(call_id, payload)
        else:
            self.open_calls.append((name, call_id))
        return out

    def _output(self, call_id: str, payload: Any) -> list[Chunk | str]:
        call = self.calls[call_id]
        if call.output_sent:  # a later execution replaying a call that has its result
            return []
        call.output_sent = True
        return [{"type": "tool-output-available", "toolCallId": call_id, "output": payload,
                 "providerExecuted": True, "dynamic": True}]


def ui_message(record: MessageRecord) -> dict[str, Any]:
    """A stored message as the SDK's `UIMessage` (for `useChat`'s initial messages)."""
    m = record.message
    parts: list[dict[str, Any]] = []
    if m.role == "assistant":
        parts.append({"type": "step-start"})
    parts.append({"type": "text", "text": m.text, "state": "done"})
    parts += _stored_steps(m.message_id, [(s.kind, s.name, s.payload_json) for s in m.steps])
    parts += [{"type": "source-url", "sourceId": f"{m.message_id}:source:{i}", "url": c.url,
               **({"title": c.title} if c.title else {})} for i, c in enumerate(m.citations)]
    return {"id": m.message_id, "role": m.role, "parts": parts,
            "metadata": {"run_id": m.run_id, "seq": record.seq,
                         "created_at_ms": m.created_at_ms}}


def _stored_steps(message_id: str, steps: Iterable[tuple[str, str, str]]) -> \
        list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for index, (kind, name, raw) in enumerate(steps):
        payload = _json_or_text(raw)
        if kind == "tool_result":
            call = next((p for p in reversed(parts) if p["toolName"] == name
                         and p["state"] == "input-available"), None)
            if call is not None:
                call["state"], call["output"] = "output-available", payload
                continue
        parts.append({"type": "dynamic-tool", "toolName": name,
                      "toolCallId": f"{message_id}:tool:{index}", "state": "input-available",
                      "input": payload})
    return parts
