"""Server-sent events made from stream-topic records: ids, frames and the run filter.

Pure: no I/O. The shared feed (`gateway.live.feed`) and the per-request Kafka replay
(`gateway.live.replay`) both turn records into events with the same `RunTracker`, so an
event has the same id, name and data whichever path delivers it.

Event ids are opaque to clients: signed resume tokens (`gateway.live.tokens`) naming the
partition, the offset, ``sub`` (it numbers the events made from one record: a
terminal lifecycle record makes two, the lifecycle event and ``done``) and
``run_start``, the offset of the run's ``run_accepted`` record, where a replay from
Kafka starts reading so that its filter state equals the feed's.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from gateway.live.tokens import ResumeTokens
from streams.core.ids import answer_message_id_for
from streams.core.lifecycle import TERMINAL, Lifecycle, RunFate, StreamEnd
from streams.core.records import (
    CitationsOutput,
    MessageEnd,
    MessageStart,
    RunLifecycle,
    StepOutput,
    StreamOutput,
    TextDelta,
    TextEnd,
    TextStart,
)
from streams.wire import EnvelopeMeta

__all__ = [
    "Position",
    "RunState",
    "RunTracker",
    "SseEvent",
    "comment_frame",
    "execution_of",
    "iso_ms",
    "make_events",
    "not_streaming_frame",
    "retry_frame",
]

Position = tuple[int, int]  # (offset, sub): the order of events within a partition


class SseEvent(NamedTuple):
    """One event as sent: its place in the partition, and its frame bytes.

    A NamedTuple, not a frozen dataclass: the feed makes one per record it
    ingests, and a frozen dataclass's __init__ (object.__setattr__ per field)
    was a tenth of that."""

    partition: int
    offset: int
    sub: int
    run_start: int
    run_id: str
    name: str
    frame: bytes
    data_at: int = 0  # where the data begins in `frame` (the id is its first line's value)

    @property
    def event_id(self) -> str:
        """The event's id: its signed resume token (`gateway.live.tokens`)."""
        # The frame is `id: {id}\nevent: {name}\ndata: {data}\n\n` (`_frame`): the
        # id ends where the lines before the data begin.
        return self.frame[4:self.data_at - len(self.name) - 15].decode()

    @property
    def data(self) -> bytes:
        """The event's data: its JSON object, or `[DONE]` for `done`."""
        return self.frame[self.data_at:-2]

    @property
    def position(self) -> Position:
        """The event's place in the partition: (offset, sub-index in the record)."""
        return (self.offset, self.sub)

    @property
    def terminal(self) -> bool:
        """Whether this is the run's final `done` event."""
        return self.name == StreamEnd.DONE


# json.dumps(data, separators=(",", ":")), without building an encoder per call.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


def _frame(event_id: str, name: str, data: str) -> tuple[bytes, int]:
    """The frame of one event, and where its data begins in it (ids and names are ASCII)."""
    return (f"id: {event_id}\nevent: {name}\ndata: {data}\n\n".encode(),
            len(event_id) + len(name) + 19)


def retry_frame(retry_ms: int) -> bytes:
    """An SSE frame telling the client how long to wait before reconnecting."""
    return f"retry: {retry_ms}\n\n".encode()


def comment_frame(text: str) -> bytes:
    """An SSE comment frame (ignored by clients; keeps the connection alive)."""
    return f": {text}\n\n".encode()


@lru_cache(maxsize=4096)
def _iso_seconds(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def iso_ms(ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC: `2026-12-01T16:56:10.123Z`."""
    seconds, milli = divmod(ms, 1000)
    return f"{_iso_seconds(seconds)}.{milli:03d}Z"


def not_streaming_frame(thread_id: str, run_id: str | None, *, seq: str | None = None,
                        at_ms: int | None = None) -> bytes:
    """The replay position is gone from the topic, or the message ended: fetch it over REST.

    No id line, so a reconnect resumes from the last real event id; `seq` repeats
    that id (the one the client resumed from) and `at_ms` is the time of the answer.
    """
    message_id = answer_message_id_for(run_id) if run_id else None
    data = {
        "thread_id": thread_id,
        "run_id": run_id,
        "message_id": message_id,
        "id": message_id,
        "seq": seq,
        "ts": None if at_ms is None else iso_ms(at_ms),
        "detail": "the stream of this message is no longer retained; "
                  "GET /v1/threads/{thread_id}/messages has it",
    }
    return f"event: {StreamEnd.MESSAGE_NOT_STREAMING}\ndata: {json.dumps(data)}\n\n".encode()


def _payload_fields(output: StreamOutput) -> tuple[str, dict[str, Any]]:
    """Event name and fields of every part but a text delta (`make_events` has those)."""
    payload = output.payload
    match payload:
        case MessageStart():
            return "message_start", {"role": payload.role}
        case TextStart():
            return "text_start", {}
        case TextEnd():
            return "text_end", {"text": payload.text}
        case StepOutput():
            return "step", {"kind": payload.kind, "name": payload.name,
                            "payload_json": payload.payload_json}
        case CitationsOutput():
            return "citations", {"citations": [{"url": c.url, "title": c.title}
                                               for c in payload.citations]}
        case MessageEnd():
            return "message_end", {"finish_reason": payload.finish_reason}
        case RunLifecycle():
            fields: dict[str, Any] = {"user_message_id": payload.user_message_id,
                                      "detail": payload.detail}
            if payload.branch_seq is not None:  # run_completed: the answer's branch (its seq)
                fields["branch"] = payload.branch_seq
            if payload.message is not None:
                m = payload.message
                fields["message"] = {
                    "message_id": m.message_id, "text": m.text,
                    "steps": [{"kind": s.kind, "name": s.name, "payload_json": s.payload_json}
                              for s in m.steps],
                    "citations": [{"url": c.url, "title": c.title} for c in m.citations],
                }
            return payload.event, fields
    raise TypeError(f"unknown stream payload {type(payload).__name__}")


def make_events(tokens: ResumeTokens, partition: int, offset: int, run_start: int,
                meta: EnvelopeMeta, output: StreamOutput) -> list[SseEvent]:
    """The SSE events of one admitted record, in order (sub 0, 1, ...), their ids
    signed by `tokens`. Text deltas, most records, skip `_payload_fields`' match."""
    payload = output.payload
    run_id = output.run_id
    # The reference contract's fields ride along: `id` (the assistant message), `seq`
    # (this event's id, the value `last_entry_id` takes) and `ts` (the record's time).
    event_id = tokens.sign(meta.thread_id, partition, offset, 0, run_start, run_id)
    ts = iso_ms(meta.produced_at_ms)
    if type(payload) is TextDelta:
        name = "text_delta"
        text = _COMPACT_JSON.encode({
            "thread_id": meta.thread_id, "run_id": run_id, "attempt": output.attempt,
            "message_id": output.message_id, "delta": payload.delta, "id": output.message_id,
            "part_id": output.part_id, "seq": event_id, "ts": ts})
    else:
        name, fields = _payload_fields(output)
        text = _COMPACT_JSON.encode({
            "thread_id": meta.thread_id, "run_id": run_id, "attempt": output.attempt,
            "message_id": output.message_id, **fields, "id": output.message_id,
            "part_id": output.part_id, "seq": event_id, "ts": ts})
    first = SseEvent(partition, offset, 0, run_start, run_id, name, *_frame(event_id, name, text))
    if name not in TERMINAL:
        return [first]
    done_id = tokens.sign(meta.thread_id, partition, offset, 1, run_start, run_id)
    return [first, SseEvent(partition, offset, 1, run_start, run_id, StreamEnd.DONE.value,
                            *_frame(done_id, StreamEnd.DONE, "[DONE]"))]


def execution_of(part_id: str) -> str:
    """The execution a record belongs to: `part_id` up to its first ':'."""
    return part_id.split(":", 1)[0]


@dataclass(slots=True)
class RunState:
    """What the filter knows of one run, from its `run_accepted` record on."""

    thread_id: str
    start: int  # offset of the run_accepted record
    fate: RunFate = field(default_factory=RunFate)  # from its lifecycle records
    attempt: int = 0  # attempt of the current execution
    execution: str | None = None
    last_seq: int = -1

    @property
    def terminal(self) -> bool:
        """Whether the run's terminal lifecycle record was read."""
        return self.fate.ended


class RunTracker:
    """Decides which records reach clients: the superseded-execution filter.

    A run is known from its `run_accepted` lifecycle record; records of a run whose
    start this tracker did not see are dropped (`admit` returns None and
    `unknown` is set), so two trackers that read from the run's start agree.
    A `MessageStart` of attempt >= the current one makes its execution current;
    output of any other execution, of attempts the processor has moved past
    (`attempt_dispatched`, `retry_scheduled`), repeats (seq not increasing) and
    anything after the terminal lifecycle record is dropped.
    """

    def __init__(self, max_finished: int = 50_000) -> None:
        self.runs: dict[str, RunState] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._max_finished = max_finished
        self.unknown = False  # set by the last `admit`: dropped for want of history

    def admit(self, thread_id: str, offset: int, output: StreamOutput) -> RunState | None:
        """The run's state if this record reaches clients; None if filtered out (stale or unknown run)."""
        self.unknown = False
        payload = output.payload
        state = self.runs.get(output.run_id)
        if isinstance(payload, RunLifecycle) and payload.event == Lifecycle.RUN_ACCEPTED:
            if state is not None:
                return None
            state = self.runs[output.run_id] = RunState(thread_id, offset)
            return state
        if state is None:
            self.unknown = True
            return None
        if state.terminal or state.thread_id != thread_id:
            return None
        if isinstance(payload, RunLifecycle):
            if payload.event in (Lifecycle.STEP_RECORDED, Lifecycle.EXECUTION_STARTED):
                return None  # for workers (the journal); clients saw the `step`s
            return self._lifecycle(state, output.run_id, payload.event, output.attempt)
        if output.attempt < state.fate.min_attempt:  # not `kills`: terminal runs are out already
            return None
        execution = execution_of(output.part_id)
        same = state.execution == execution and state.attempt == output.attempt
        if isinstance(payload, MessageStart) and not (same and output.seq <= state.last_seq):
            if state.execution is not None and output.attempt < state.attempt:
                return None
            state.attempt, state.execution, state.last_seq = output.attempt, execution, output.seq
            return state
        if not same or output.seq <= state.last_seq:
            return None
        state.last_seq = output.seq
        return state

    def forget(self, of_thread: Callable[[str], bool]) -> None:
        """Forget the runs of the threads `of_thread` picks (their partition moved to
        another gateway: should it come back, they are read again from their start)."""
        for run_id in [r for r, state in self.runs.items() if of_thread(state.thread_id)]:
            del self.runs[run_id]
            self._finished.pop(run_id, None)

    def _lifecycle(self, state: RunState, run_id: str, event: str,
                   attempt: int) -> RunState | None:
        if not state.fate.learn(event, attempt):
            return state
        if state.fate.ended:
            self._finished[run_id] = None
            while len(self._finished) > self._max_finished:
                old, _ = self._finished.popitem(last=False)
                self.runs.pop(old, None)
        if state.attempt < state.fate.min_attempt:
            state.execution = None
        return state
