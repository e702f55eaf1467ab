"""The stream records of one execution's answer, from the agent's outputs.

Pure: no I/O, and the caller passes the (monotonic) time. An execution's
records are: MessageStart, then per text part TextStart, TextDelta* (deltas
coalesced for `coalesce_s`, and while the caller holds them), TextEnd, then
StepOutput*, CitationsOutput?, MessageEnd. Each record's `part_id` is
`{execution_id}:{part}` with `part` one of `message`, `text:{n}`, `step:{n}`,
`citations`, and `seq` numbers the execution's records from 0.
"""

from __future__ import annotations

from streams.core.domain import Citation, Step
from streams.core.records import (
    CitationsOutput,
    MessageEnd,
    MessageStart,
    StepOutput,
    StreamOutput,
    StreamPart,
    TextDelta,
    TextEnd,
    TextStart,
)

__all__ = ["Answer"]


class Answer:
    """One execution's answer as it streams: its records, numbered, and its totals."""

    def __init__(self, run_id: str, attempt: int, message_id: str, execution_id: str,
                 coalesce_s: float, budget_bytes: int) -> None:
        self.run_id, self.attempt, self.message_id = run_id, attempt, message_id
        self.execution_id = execution_id
        self.coalesce_s = coalesce_s
        # The answer must fit the records that carry it whole: past the cap the run
        # ends `output_too_large` (not retried: the agent would say as much again).
        self.budget = budget_bytes
        self.seq = 0
        self.texts: list[str] = []
        self.steps: list[Step] = []
        self.citations: list[Citation] = []
        self.flush_at: float | None = None  # when the pending deltas are due
        self._parts = 0  # text parts opened
        self._part: list[str] | None = None  # the open text part's text
        self._pending: list[str] = []  # deltas not yet sent

    @property
    def text(self) -> str:
        """The answer's whole text so far."""
        return "".join(self.texts)

    def record(self, payload: StreamPart, part: str) -> StreamOutput:
        """The next record of this execution: `payload` in part `part`."""
        output = StreamOutput(run_id=self.run_id, attempt=self.attempt,
                              message_id=self.message_id,
                              part_id=f"{self.execution_id}:{part}", seq=self.seq,
                              payload=payload)
        self.seq += 1
        return output

    def start(self) -> list[StreamOutput]:
        """The message's first record."""
        return [self.record(MessageStart("assistant"), "message")]

    def spend(self, *texts: str) -> bool:
        """Count `texts` against the output budget; False once it is spent."""
        self.budget -= sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        return self.budget >= 0

    def add_text(self, chunk: str, now: float, hold: bool = False) -> list[StreamOutput]:
        """A chunk of text (spent already): opens a text part if none is open, and
        sends the pending deltas once they have waited `coalesce_s`, unless `hold`
        (the caller's previous delta is not delivered yet: see `Execution._stream`)."""
        out: list[StreamOutput] = []
        if self._part is None:
            self._part, self._parts = [], self._parts + 1
            out.append(self.record(TextStart(), self._text_part))
        self._part.append(chunk)
        self.texts.append(chunk)
        self._pending.append(chunk)
        if self.flush_at is None:
            self.flush_at = now + self.coalesce_s
        if now >= self.flush_at and not hold:
            out += self.flush()
        return out

    def flush(self) -> list[StreamOutput]:
        """The pending deltas, as one TextDelta (none if nothing is pending)."""
        out: list[StreamOutput] = []
        if self._pending:
            out.append(self.record(TextDelta("".join(self._pending)), self._text_part))
            self._pending.clear()
        self.flush_at = None
        return out

    def close_text(self) -> list[StreamOutput]:
        """The pending deltas and the open text part's end, if one is open."""
        out = self.flush()
        if self._part is not None:
            out.append(self.record(TextEnd("".join(self._part)), self._text_part))
            self._part = None
        return out

    def add_step(self, step: Step) -> list[StreamOutput]:
        """A step (spent already; the caller closed the text part first)."""
        self.steps.append(step)
        return [self.record(StepOutput(step.kind, step.name, step.payload_json),
                            f"step:{len(self.steps) - 1}")]

    def add_citations(self, citations: tuple[Citation, ...]) -> None:
        """Citations (spent already): sent together at the end."""
        self.citations.extend(citations)

    def end(self) -> list[StreamOutput]:
        """The records that end a complete answer."""
        out = self.close_text()
        if self.citations:
            out.append(self.record(CitationsOutput(tuple(self.citations)), "citations"))
        out.append(self.record(MessageEnd("stop"), "message"))
        return out

    def end_interrupted(self) -> list[StreamOutput]:
        """The records that end an answer the agent broke off to ask a human."""
        return [*self.close_text(), self.record(MessageEnd("interrupted"), "message")]

    def end_with_error(self) -> list[StreamOutput]:
        """The record that ends an answer the agent or the worker broke off."""
        return [self.record(MessageEnd("error"), "message")]

    @property
    def _text_part(self) -> str:
        return f"text:{self._parts - 1}"
