"""The per-thread vocabulary: commands, events, state and policy.

Pure data, no I/O. Everything that is not pure (the clock, ids, model output)
arrives inside a command, so that `decide` and `evolve` (in `streams.core.thread`)
are deterministic and a recorded command log always replays to the same events.

Each command and event class has a matching Avro record in `schemas/` with the
same name and fields; `streams.wire` owns the mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from streams.core.journal import JournalEntry, JournalLimits

__all__ = [
    "NOTHING_KNOWN",
    "TERMINAL_EVENTS",
    "ActiveRun",
    "AssistantMessage",
    "AttemptDispatched",
    "AttemptStarted",
    "BranchSwitched",
    "CancelRun",
    "CheckDeadlines",
    "Citation",
    "Command",
    "CopiedMessage",
    "CopyThread",
    "CreateThread",
    "DeleteThread",
    "EditMessage",
    "Event",
    "ExecutionStarted",
    "HeartbeatRecorded",
    "HistoryImported",
    "IdempotencyRecord",
    "ImportHistory",
    "JournalEntry",
    "JournalLimits",
    "Known",
    "MessageAccepted",
    "MessageQueued",
    "PartialAnswerStored",
    "MultitaskStrategy",
    "Policy",
    "PostUserMessage",
    "RejectReason",
    "ReportAttemptCompleted",
    "ReportAttemptFailed",
    "ReportAttemptStarted",
    "ReportHeartbeat",
    "ReportExecutionStarted",
    "ReportStepCompleted",
    "ResumeRun",
    "RetryScheduled",
    "RunAccepted",
    "RunCancelled",
    "RunCompleted",
    "RunFailed",
    "RunInterrupted",
    "RunRecord",
    "RunRejected",
    "RunStatus",
    "Step",
    "StepRecorded",
    "StoredMessage",
    "QueuedMessage",
    "RegenerateAccepted",
    "RegenerateAnswer",
    "SwitchBranch",
    "ThreadCopied",
    "ThreadCreated",
    "ThreadDeleted",
    "ThreadState",
    "WorkerReport",
]


def _frozen_map() -> Mapping[str, object]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Policy:
    """Retry and liveness settings; every number is configurable."""

    max_attempts: int = 2
    backoff_initial_ms: int = 2_000
    backoff_multiplier: float = 2.0
    backoff_max_ms: int = 30_000
    heartbeat_timeout_ms: int = 60_000
    attempt_timeout_ms: int = 300_000
    max_input_chars: int = 32_000
    # Bounds on what one command may put into the thread's state and records:
    max_title_chars: int = 500
    max_id_chars: int = 255  # message ids and idempotency keys
    max_output_bytes: int = 512 * 1024  # an answer's text, steps and citations, UTF-8
    # The key-to-body check of an idempotency key expires after this window, and the
    # state keeps at most this many keys (oldest dropped first). A message id that
    # already ran never runs again, whatever its age: that check reads the history.
    idempotency_window_ms: int = 24 * 60 * 60 * 1000
    max_idempotency_keys: int = 256
    # User messages a thread may hold queued behind its active run (enqueue).
    max_queued_messages: int = 16
    # A run's step journal: caps on its steps, tool calls and bytes (streams.core.journal).
    journal: JournalLimits = field(default_factory=JournalLimits)
    # How long an interrupted run waits for its resume before it fails; 0: forever.
    interrupt_timeout_ms: int = 0
    # Branches a thread may hold, the current one included (streams.core.branches): a
    # regenerate or edit that would make one more is refused. The state keeps one seq
    # per branch, so this bounds it.
    max_branches: int = 100

    def backoff_ms(self, failed_attempt: int) -> int:
        """Delay before the attempt after `failed_attempt` (1-based)."""
        delay = self.backoff_initial_ms * self.backoff_multiplier ** (failed_attempt - 1)
        return int(min(delay, self.backoff_max_ms))


# --- value objects ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """A tool call or tool result the agent made while answering."""

    kind: str  # "tool_call" | "tool_result"
    name: str
    payload_json: str


@dataclass(frozen=True, slots=True)
class Citation:
    """A source the assistant cited: its URL and title."""
    url: str
    title: str


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    """The authoritative final answer of a run."""

    message_id: str
    text: str
    steps: tuple[Step, ...] = ()
    citations: tuple[Citation, ...] = ()


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as stored on the thread and served over REST."""

    message_id: str
    role: str  # "user" | "assistant"
    text: str
    run_id: str
    created_at_ms: int
    steps: tuple[Step, ...] = ()
    citations: tuple[Citation, ...] = ()


@dataclass(frozen=True, slots=True)
class CopiedMessage:
    """A stored message of a copied thread, at the same seq and parent in the copy
    (`streams.core.copies`): a messages-topic record without its envelope."""

    seq: int
    message: StoredMessage
    run_status: RunStatus | None = None
    run_attempts: int = 0
    parent_seq: int | None = None


# --- commands: imperative, from the gateway, producers, workers, the clock ---


@dataclass(frozen=True, slots=True)
class CreateThread:
    """Command: open a new thread for a tenant."""
    thread_id: str
    tenant: str
    title: str
    now_ms: int


class MultitaskStrategy(StrEnum):
    """What a user message posted while a run is active does (double-texting)."""

    REJECT = "reject"  # refused: RunRejected(conflict), the gateway's 409
    ENQUEUE = "enqueue"  # stored and queued; it runs once every run before it has ended
    INTERRUPT = "interrupt"  # the active run is cancelled (its messages kept), this one runs
    ROLLBACK = "rollback"  # the active run is cancelled and its messages tombstoned


@dataclass(frozen=True, slots=True)
class PostUserMessage:
    """Command: add a user's message to a thread, which starts a run."""
    thread_id: str
    tenant: str
    message_id: str
    text: str
    idempotency_key: str | None
    now_ms: int
    multitask_strategy: MultitaskStrategy = MultitaskStrategy.REJECT


@dataclass(frozen=True, slots=True)
class RegenerateAnswer:
    """Command: answer user message `message_id` again, on a new branch from it.

    The run it starts is named by `idempotency_key` (`ids.regenerate_run_id_for`), so
    the same key never answers twice; a run active on the thread is handled as
    `multitask_strategy` says (docs/branches.md)."""

    thread_id: str
    tenant: str
    message_id: str
    idempotency_key: str
    now_ms: int
    multitask_strategy: MultitaskStrategy = MultitaskStrategy.REJECT


@dataclass(frozen=True, slots=True)
class EditMessage:
    """Command: post `text` as user message `new_message_id` in place of user message
    `message_id`: a new branch from that message's parent, which then runs."""

    thread_id: str
    tenant: str
    message_id: str
    new_message_id: str
    text: str
    idempotency_key: str | None
    now_ms: int
    multitask_strategy: MultitaskStrategy = MultitaskStrategy.REJECT


@dataclass(frozen=True, slots=True)
class SwitchBranch:
    """Command: make the branch whose head is message `seq` the thread's current one."""

    thread_id: str
    tenant: str
    seq: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class CopyThread:
    """Command: copy the thread, every branch of it, into new thread `target_thread_id`
    (`streams.core.copies`): its processor sends the stored history there as
    `ImportHistory` commands, in the transaction that decides this one."""

    thread_id: str
    tenant: str
    target_thread_id: str
    title: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class ImportHistory:
    """Command from the processor of a copied thread: part `part` of `parts` of its
    history, for the copy `thread_id`. Part 0 creates the copy; until the last part is
    in, the copy takes no post."""

    thread_id: str
    tenant: str
    source_thread_id: str
    title: str
    part: int
    parts: int
    messages: tuple[CopiedMessage, ...]
    message_count: int
    head_seq: int
    tip_seqs: tuple[int, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class DeleteThread:
    """Erase the thread: its state and every stored message (a live run is cancelled)."""

    thread_id: str
    tenant: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class CancelRun:
    """Command: stop a thread's active run."""
    thread_id: str
    tenant: str
    run_id: str
    reason: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class ReportAttemptStarted:
    """Worker report: it began running `attempt` of `run_id`."""

    thread_id: str
    run_id: str
    attempt: int
    worker_id: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class ReportHeartbeat:
    """Command from a worker: the attempt is still alive."""
    thread_id: str
    run_id: str
    attempt: int
    worker_id: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class ReportAttemptCompleted:
    """Command from a worker: the attempt finished with the assistant's answer."""
    thread_id: str
    run_id: str
    attempt: int
    worker_id: str
    final_text: str
    steps: tuple[Step, ...]
    citations: tuple[Citation, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class ReportAttemptFailed:
    """Command from a worker: the attempt failed, and whether a retry may help."""
    thread_id: str
    run_id: str
    attempt: int
    worker_id: str
    error: str
    retryable: bool
    now_ms: int


@dataclass(frozen=True, slots=True)
class ReportStepCompleted:
    """Worker report: the attempt completed a step (`entry.step`), to be journaled."""

    thread_id: str
    run_id: str
    attempt: int
    worker_id: str
    entry: JournalEntry
    now_ms: int


@dataclass(frozen=True, slots=True)
class ReportExecutionStarted:
    """Worker report: an execution of the attempt began. Decided after every earlier
    report on the thread (one partition, in order), so once the execution sees its
    `ExecutionStarted`, every step reported before it is in the journal it can read."""

    thread_id: str
    run_id: str
    attempt: int
    worker_id: str
    execution_id: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class ResumeRun:
    """Command: continue an interrupted run; the agent's `interrupt()` returns the value."""

    thread_id: str
    tenant: str
    run_id: str
    value_json: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class CheckDeadlines:
    """The clock: the processor's timer asks the thread to act on due deadlines."""

    thread_id: str
    now_ms: int


# What a worker reports about an attempt, fenced by the attempt number (`thread.decide`).
WorkerReport = (
    ReportAttemptStarted
    | ReportHeartbeat
    | ReportAttemptCompleted
    | ReportAttemptFailed
    | ReportStepCompleted
    | ReportExecutionStarted
)

Command = (
    CreateThread | PostUserMessage | CancelRun | WorkerReport | CheckDeadlines | DeleteThread | ResumeRun
    | RegenerateAnswer | EditMessage | SwitchBranch | CopyThread | ImportHistory
)


@dataclass(frozen=True, slots=True)
class Known:
    """What the shell looked up for a command beyond the bounded state.

    The state holds no per-message index (its size must not grow with the thread),
    so the shell reads the thread's stored history and hands the answer in here."""

    # The run an earlier post of this message id started (PostUserMessage, and
    # EditMessage's new_message_id); for RegenerateAnswer, the run its key names, if
    # the stored history holds a record of it.
    message_run_id: str | None = None
    # RegenerateAnswer and EditMessage: the seq of the stored user message they name
    # (-1: none on the thread), and that message's parent (-1: it is a root).
    target_seq: int = -1
    target_parent_seq: int = -1
    # CopyThread: how many ImportHistory parts the stored history takes (`copies.split_parts`).
    copy_parts: int = 1


NOTHING_KNOWN = Known()


# --- events: past tense, durable, the only way state changes ----------------


class RejectReason(StrEnum):
    """Why the processor refused a user message."""
    CONFLICT = "conflict"  # another run is active on the thread
    DUPLICATE = "duplicate"  # the message id or idempotency key already ran
    UNKNOWN_THREAD = "unknown_thread"  # no such thread for this tenant
    INVALID = "invalid"  # the command breaks a rule (empty text, too long, ...)
    PAYLOAD_MISMATCH = "payload_mismatch"  # same idempotency key, other payload


@dataclass(frozen=True, slots=True)
class ThreadCreated:
    """Event: a thread was opened."""
    thread_id: str
    tenant: str
    title: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class MessageAccepted:
    """Event: a user message was added to a thread's history."""
    thread_id: str
    message_id: str
    text: str
    idempotency_key: str | None
    at_ms: int
    # None: it continues the current branch (its parent is the branch's head). A seq:
    # it starts a branch of its own from that message (-1: a new root), an edit's.
    parent_seq: int | None = None


@dataclass(frozen=True, slots=True)
class MessageQueued:
    """Event: a user message waits behind the active run (enqueue): by default the one
    accepted just before; for a regenerate, the message at `seq`, answered by `run_id`."""
    thread_id: str
    message_id: str
    ahead: int  # messages queued before it
    at_ms: int
    seq: int | None = None  # None: the message accepted just before (the newest)
    run_id: str | None = None  # None: the message's own run (`ids.run_id_for`)
    branch: bool = False  # when its run starts, the branch at `seq` becomes current
    parent_seq: int | None = None  # the message's parent; None: the message before it


@dataclass(frozen=True, slots=True)
class RegenerateAccepted:
    """Event: a regenerate of the answer to user message `message_id` (at `seq`) was
    accepted; `run_id` answers it again, on a branch from that message."""

    thread_id: str
    message_id: str
    seq: int
    run_id: str
    idempotency_key: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class BranchSwitched:
    """Event: the branch whose head is message `seq` became current; the head before it
    is kept as the tip of its branch."""

    thread_id: str
    seq: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class RunAccepted:
    """Event: a run was started for a user message."""
    thread_id: str
    run_id: str
    workflow_id: str
    message_id: str
    at_ms: int
    # The parent of the run's user message in the thread's tree, when it is not the
    # message before it: where the branch's head goes if the run is rolled back.
    parent_seq: int | None = None


@dataclass(frozen=True, slots=True)
class RunRejected:
    """Event: a user message was refused, with the reason."""
    thread_id: str
    message_id: str
    reason: RejectReason
    detail: str
    # For DUPLICATE: the run the original request started, reported back.
    existing_run_id: str | None
    at_ms: int


@dataclass(frozen=True, slots=True)
class AttemptDispatched:
    """Hand attempt `attempt` to the workers; the attempt number fences reports."""

    thread_id: str
    run_id: str
    message_id: str
    attempt: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    """Event: a worker began an attempt of a run."""
    thread_id: str
    run_id: str
    attempt: int
    worker_id: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class HeartbeatRecorded:
    """Event: a worker's heartbeat for the current attempt was noted."""
    thread_id: str
    run_id: str
    attempt: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class RetryScheduled:
    """Event: an attempt failed or timed out and the next one waits until due_ms."""
    thread_id: str
    run_id: str
    failed_attempt: int
    next_attempt: int
    due_ms: int
    reason: str  # "failed: ..." or a deadline's FailureCode (streams.core.reasons)
    at_ms: int


@dataclass(frozen=True, slots=True)
class RunCompleted:
    """Event: a run ended with the assistant's message."""
    thread_id: str
    run_id: str
    attempt: int
    message: AssistantMessage
    at_ms: int


@dataclass(frozen=True, slots=True)
class RunFailed:
    """Event: a run ended in failure after its last attempt."""
    thread_id: str
    run_id: str
    attempt: int
    error: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class RunCancelled:
    """Event: a run was stopped on request."""
    thread_id: str
    run_id: str
    reason: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class StepRecorded:
    """Event: a step of the current attempt joined the run's journal (a sign of life too)."""

    thread_id: str
    run_id: str
    attempt: int
    entry: JournalEntry
    at_ms: int


@dataclass(frozen=True, slots=True)
class RunInterrupted:
    """Event: the agent asked a human; the run waits, without heartbeats, for `ResumeRun`."""

    thread_id: str
    run_id: str
    attempt: int
    step: int  # the interrupt's step number in the journal once resumed
    payload_json: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class ExecutionStarted:
    """Event: an execution of the current attempt began (a sign of life too)."""

    thread_id: str
    run_id: str
    attempt: int
    execution_id: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class PartialAnswerStored:
    """Event: the answer an interrupted run had streamed (multitask_strategy interrupt),
    reported by its worker once it stopped; stored after the run ended, marked."""
    thread_id: str
    run_id: str
    attempt: int
    message: AssistantMessage
    at_ms: int


@dataclass(frozen=True, slots=True)
class ThreadDeleted:
    """Event: a thread and its messages were deleted."""
    thread_id: str
    tenant: str
    message_count: int  # message records tombstoned: seq 0 .. message_count - 1
    at_ms: int


@dataclass(frozen=True, slots=True)
class ThreadCopied:
    """Event, on the thread copied: its history went to `target_thread_id` as `parts`
    `ImportHistory` commands, in this event's transaction."""

    thread_id: str
    target_thread_id: str
    message_count: int
    parts: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class HistoryImported:
    """Event, on a copy: part `part` of `parts` of the copied history (`count`
    messages) was stored; the last part makes the copy take posts."""

    thread_id: str
    source_thread_id: str
    part: int
    parts: int
    count: int
    message_count: int
    head_seq: int
    tip_seqs: tuple[int, ...]
    at_ms: int

    @property
    def last(self) -> bool:
        """Whether this part completes the copy."""
        return self.part == self.parts - 1


Event = (
    ThreadCreated
    | MessageAccepted
    | RunAccepted
    | RunRejected
    | AttemptDispatched
    | AttemptStarted
    | HeartbeatRecorded
    | RetryScheduled
    | RunCompleted
    | RunFailed
    | RunCancelled
    | ThreadDeleted
    | MessageQueued
    | PartialAnswerStored
    | StepRecorded
    | RunInterrupted
    | ExecutionStarted
    | RegenerateAccepted
    | BranchSwitched
    | ThreadCopied
    | HistoryImported
)

TERMINAL_EVENTS = (RunCompleted, RunFailed, RunCancelled)


# --- state -------------------------------------------------------------------


class RunStatus(StrEnum):
    """Where a run stands: dispatched, running, waiting to retry, or ended."""
    DISPATCHED = "dispatched"  # attempt handed to workers, not yet started
    RUNNING = "running"  # a worker reported the attempt started
    RETRY_WAIT = "retry_wait"  # waiting for the backoff before the next attempt
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """Whether the run has ended (completed, failed or cancelled)."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


@dataclass(frozen=True, slots=True)
class ActiveRun:
    """The run in progress on a thread: its attempt, status and liveness times."""
    run_id: str
    message_id: str
    attempt: int
    status: RunStatus
    attempt_started_ms: int  # when the current attempt was dispatched
    last_heartbeat_ms: int  # last sign of life of the current attempt
    retry_due_ms: int | None  # when RETRY_WAIT ends
    message_seq: int = -1  # seq of the user message in the thread's history
    accepted_at_ms: int = 0
    journal: tuple[JournalEntry, ...] = ()  # completed steps, across attempts (Policy.journal)
    # Set while the run waits for a human (status RETRY_WAIT with no retry due, so no
    # deadline and no worker report applies): what the agent asked, JSON. Not a
    # RunStatus symbol: an enum symbol old readers lack would break them.
    interrupt_json: str | None = None
    # The parent of the user message (streams.core.branches); None: the message before it.
    parent_seq: int | None = None

    @property
    def awaiting_resume(self) -> bool:
        """Whether the run waits for a human's resume (`streams.core.interrupts`)."""
        return self.interrupt_json is not None

    @property
    def shown_status(self) -> str:
        """The status as the API shows it: `interrupted` while it waits for a human."""
        return "interrupted" if self.awaiting_resume else self.status.value


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What a run was when it ended."""

    run_id: str
    message_id: str
    status: RunStatus
    attempts: int


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """What an idempotency key was first used for: its message, run and body fingerprint."""
    message_id: str
    run_id: str
    payload_fingerprint: str
    at_ms: int = 0  # first use; the key-to-body check expires a window later


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """A stored user message waiting for the active run to end; its text is at `seq`."""

    message_id: str
    seq: int
    at_ms: int
    run_id: str | None = None  # None: the message's own run; a regenerate's otherwise
    branch: bool = False  # its run starts on the branch at `seq` (a regenerate or edit)
    parent_seq: int | None = None  # the message's parent; None: the message before it


@dataclass(frozen=True, slots=True)
class ThreadState:
    """One thread's decision state; `None` in the table means the thread does not exist.

    Bounded: its size does not depend on how many messages or runs the thread has
    had (the history is stored per message, see `streams.core.history`), only on the
    idempotency keys, which `Policy` caps by age and count, on the queue of
    enqueued messages (ids and seqs, no text), capped by `Policy.max_queued_messages`,
    and on the branch tips (one seq each), capped by `Policy.max_branches`."""

    thread_id: str
    tenant: str
    title: str
    created_at_ms: int
    active_run: ActiveRun | None = None
    idempotency: Mapping[str, IdempotencyRecord] = field(default_factory=_frozen_map)  # type: ignore[arg-type]
    message_count: int = 0  # the seq of the next stored message
    run_count: int = 0
    last_run: RunRecord | None = None  # the most recent run that ended
    updated_at_ms: int = 0
    queued: tuple[QueuedMessage, ...] = ()  # oldest first; each runs when the runs before end
    # Message ids of the newest rolled-back runs: their history records are tombstoned,
    # so `Known` no longer finds them. Capped by Policy.max_idempotency_keys.
    rolled_back: tuple[str, ...] = ()
    # The newest run a double text interrupted, until its worker's report of the
    # partial answer is stored (at most one is waited for: a newer one replaces it).
    interrupted: RunRecord | None = None
    # Branches (streams.core.branches). The head of the current branch: where the next
    # message goes; -1 means the newest stored message, which it always is on a thread
    # that never branched, so states written before branches read as a straight line.
    head_seq: int = -1
    # The heads of the thread's other branches, oldest first; fewer than
    # Policy.max_branches.
    tip_seqs: tuple[int, ...] = ()
    # The head of the branch the `interrupted` run was on, once another branch became
    # current before its partial answer came (-1: the current branch).
    interrupted_tip_seq: int = -1
    # Copies (streams.core.copies): the thread this one was copied from, and the
    # ImportHistory parts still to come; while any are, the thread takes no post.
    copied_from: str | None = None
    import_parts_left: int = 0
