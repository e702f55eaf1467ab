"""Records of the dispatch, stream and dead-letter topics.

Pure data like `streams.core.domain`: the commands and events live there, these are
the other messages that cross Kafka. Each class has a matching Avro record in
`schemas/` with the same name and fields; `streams.wire` owns the mapping.
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.core.domain import AssistantMessage, Citation, RunStatus, StoredMessage
from streams.core.journal import JournalEntry

__all__ = [
    "CitationsOutput",
    "DeadLetter",
    "Dispatch",
    "HistoryMessage",
    "MessageEnd",
    "MessageRecord",
    "MessageStart",
    "RunLifecycle",
    "StepOutput",
    "StreamOutput",
    "StreamPart",
    "TextDelta",
    "TextEnd",
    "TextStart",
]


@dataclass(frozen=True, slots=True)
class HistoryMessage:
    """An earlier message of the thread, given to the agent as context."""

    message_id: str
    role: str  # "user" | "assistant"
    text: str


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """One stored message of a thread, a record of the messages topic (thread and
    tenant are in the envelope; `streams.core.history` says what is written when)."""

    seq: int
    message: StoredMessage
    run_status: RunStatus | None = None  # user messages: the status of their run
    run_attempts: int = 0
    # Its parent in the thread's tree (streams.core.branches): None for the message
    # before it, as every record written before branches; -1 for a root.
    parent_seq: int | None = None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """An attempt of a run handed to the workers (thread and tenant are in the envelope)."""

    run_id: str
    message_id: str
    attempt: int
    workflow_id: str
    input_text: str
    history: tuple[HistoryMessage, ...]
    dispatched_at_ms: int
    journal: tuple[JournalEntry, ...] = ()  # steps earlier attempts completed: replayed


# --- live output: the parts of one streamed assistant message ---------------


@dataclass(frozen=True, slots=True)
class MessageStart:
    """The first record of a streamed message, naming its role (the worker's answers are "assistant")."""
    role: str


@dataclass(frozen=True, slots=True)
class TextStart:
    """A text part of the message opens; its deltas and its TextEnd follow under the same part id."""
    pass


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New text of the open text part: the chunks that arrived since the last delta, joined."""
    delta: str


@dataclass(frozen=True, slots=True)
class TextEnd:
    """The text part ends; `text` is its full text."""

    text: str


@dataclass(frozen=True, slots=True)
class StepOutput:
    """A tool call or tool result, as it happens."""

    kind: str  # "tool_call" | "tool_result"
    name: str
    payload_json: str


@dataclass(frozen=True, slots=True)
class CitationsOutput:
    """The answer's citations, sent together once, just before the message ends."""
    citations: tuple[Citation, ...]


@dataclass(frozen=True, slots=True)
class MessageEnd:
    """The last record of a streamed message: finish_reason "stop" if complete, "error" if broken off."""
    finish_reason: str


@dataclass(frozen=True, slots=True)
class RunLifecycle:
    """A run's lifecycle decision, mirrored by the processor into the stream topic."""

    event: str  # run_accepted | attempt_dispatched | retry_scheduled | run_completed | ...
    user_message_id: str
    detail: str
    message: AssistantMessage | None = None
    # run_completed: the seq of the stored answer, its branch's newest message (issue #30).
    branch_seq: int | None = None


StreamPart = (
    MessageStart
    | TextStart
    | TextDelta
    | TextEnd
    | StepOutput
    | CitationsOutput
    | MessageEnd
    | RunLifecycle
)


@dataclass(frozen=True, slots=True)
class StreamOutput:
    """One record of a worker's live output (thread and tenant are in the envelope).

    `seq` numbers the records of one attempt from 0, so a reader can order them
    and drop repeats after a producer retry.
    """

    run_id: str
    attempt: int
    message_id: str
    part_id: str
    seq: int
    payload: StreamPart


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An input record that could not be processed, kept byte for byte."""

    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None
    value: bytes
    reason: str  # for a human: what went wrong
    error_type: str  # the exception class name
    failed_at_ms: int
