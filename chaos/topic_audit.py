"""What exactly-once adds, audited on the topics: every record once, none aborted.

The answers audit (`chaos.audit`) passes with the processor in `at_least_once`
mode too: the idempotent core decides nothing new for most replayed commands, so
answers, runs and watchers look right either way. What only the transaction
promises is on the topics: a batch that was cut off and run again shows *twice*
there, once for the cut-off copy and once for the retry, unless the cut-off copy
was aborted and a `read_committed` reader skips it.

Pure, like `chaos.audit`: `audit_topics` reads plain data (`TopicReads`, built by
`chaos.read` from a `read_committed` and a `read_uncommitted` read of each topic)
and returns `Findings`, which `chaos.audit` adds to its `Report`.

**Identities.** A replayed batch repeats what the processor derives from its
input, so that is what each record is identified by:

* `events`: the envelope id, which the processor derives from the command's
  envelope id and the event's index in the decision (`_derived_id` in
  `streams/processor.py`), so the same command decided twice repeats it even when
  the second decision differs (a post replayed after its state advanced is a
  `RunRejected` under the `MessageAccepted`'s id); and a derived identity for the
  decisions that may happen once per run or attempt: (thread, event type,
  message or run id, attempt). `RunRejected` has no derived identity: every
  resend of a post is rightly rejected again, under its own command's envelope id.
* `dispatch`: the envelope id (that of its `AttemptDispatched`) and (thread, run,
  attempt).
* `messages`: (envelope id, key) (one decision writes the answer and rewrites the
  user message under one envelope id) and (thread, seq, run status): a user
  message is written `dispatched` when accepted and once more when its run ends,
  an answer once.
* `dead-letter`: (source topic, partition, offset, error type) of the dead record.
* `threads` is **not** checked for once: a state has no id, and a batch in
  which a thread only had a post rejected (a 409, a resent post) rightly writes
  the unchanged state again, so a replayed batch's identical rewrite cannot be
  told from it. The newest state of each thread is checked against the history
  and the events instead (written in the same transactions, they must agree),
  and its counters never go back.

**Aborted records.** The `read_uncommitted` read (taken after the committed one)
shows what the `read_committed` one hides: the records of aborted transactions,
up to the last committed record of each partition (past it a transaction may
still be open). They are counted (`aborted`), and each must have a committed
twin with the same derived identity (an aborted batch is decided again, on the
same committed state); every committed record must be in the uncommitted read.

**The history.** For every answered message the `messages` topic (committed)
holds the user message and the answer, each under one key, at consecutive seqs
(but for messages queued in between) in the order the client posted, and the
user record's newest version has run status `completed`; a thread's seqs have no
gap (a rolled-back message's tombstone keeps its seq). A message queued behind a
run (multitask_strategy enqueue) is stored when posted and answered when its turn
comes, so its answer follows it, not necessarily at the next seq, and it may
stand between an earlier message and that message's answer.

Branches (issue #30): an answer that follows its message at the next seq must be
linked to it (`parent_seq`). A regenerate's answer is stored at the next free seq
and linked to the older question it answers again (past only messages queued behind
its run meanwhile, as for any post; whatever else stands between belongs to other
branches), so its seqs are checked by those links instead of by order; an edit's
new message must have the parent of the message it replaces.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from streams.core.branches import parent_seq_of
from streams.core.domain import (
    AttemptDispatched,
    AttemptStarted,
    Event,
    ExecutionStarted,
    HeartbeatRecorded,
    MessageAccepted,
    MessageQueued,
    PartialAnswerStored,
    RetryScheduled,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunInterrupted,
    RunStatus,
    StepRecorded,
    ThreadCreated,
    ThreadDeleted,
    ThreadState,
)
from streams.core.records import DeadLetter, Dispatch, MessageRecord

__all__ = [
    "AcceptedPost",
    "Findings",
    "HistoryRecord",
    "StateRecord",
    "TopicReads",
    "TopicRecord",
    "audit_topics",
    "dead_letter_identities",
    "dispatch_identities",
    "event_identities",
    "message_identities",
]

ONCE_TOPICS = ("events", "dispatch", "messages", "dead-letter")

Identity = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """One record of a transactional topic as a reader saw it."""

    topic: str  # events | dispatch | threads | messages | dead-letter
    partition: int
    offset: int
    identities: tuple[Identity, ...]  # each must be once on its topic
    what: str = ""  # for a violation's text


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One committed record of the messages topic (a tombstone has no message)."""

    thread_id: str
    seq: int
    partition: int
    offset: int
    record: MessageRecord | None


@dataclass(frozen=True, slots=True)
class StateRecord:
    """One committed record of the threads topic."""

    thread_id: str
    partition: int
    offset: int
    state: ThreadState | None


@dataclass(slots=True)
class TopicReads:
    """The transactional topics as read back after the run, committed and uncommitted."""
    committed: list[TopicRecord] = field(default_factory=list)
    uncommitted: list[TopicRecord] = field(default_factory=list)  # empty: not read
    history: list[HistoryRecord] = field(default_factory=list)
    states: list[StateRecord] = field(default_factory=list)
    events: list[tuple[str, Event]] = field(default_factory=list)  # (thread, event), committed
    # run_id:step -> when the processor decided its StepRecorded (the event's envelope time)
    step_decided_ms: dict[str, int] = field(default_factory=dict)


class AcceptedPost(Protocol):
    """What the audits read of a post the API accepted (`chaos.audit.Post` is one)."""

    @property
    def thread_id(self) -> str:
        """The thread it was posted to."""
    @property
    def message_id(self) -> str:
        """Its user message (a regenerate: the question answered again)."""
    @property
    def run_id(self) -> str:
        """The run that answers it."""


@dataclass(slots=True)
class Findings:
    """What `audit_topics` found: violations as (report counter or None, text)."""

    violations: list[tuple[str | None, str]] = field(default_factory=list)
    aborted: int = 0  # records the read_uncommitted read has and the committed one hides

    def _fail(self, counter: str | None, text: str) -> None:
        self.violations.append((counter, text))


# --- identities ---------------------------------------------------------------------


def event_identities(envelope_id: str, event: Event) -> tuple[Identity, ...]:
    """What makes an event unique: its envelope id, and its thread, kind and the ids it decides on."""
    ids: list[Identity] = [("envelope", envelope_id)]
    thread, kind = event.thread_id, type(event).__name__
    match event:
        case ThreadCreated() | ThreadDeleted():
            ids.append((thread, kind))
        case MessageAccepted() | MessageQueued():
            ids.append((thread, kind, event.message_id))
        case RunAccepted():
            ids.append((thread, kind, event.run_id))
        case AttemptDispatched() | AttemptStarted():
            ids.append((thread, kind, event.run_id, event.attempt))
        case HeartbeatRecorded():
            ids.append((thread, kind, event.run_id, event.attempt, event.at_ms))
        case RetryScheduled():
            ids.append((thread, kind, event.run_id, event.failed_attempt))
        case RunCompleted() | RunFailed() | RunCancelled():
            ids.append((thread, "RunEnded", event.run_id))
        case PartialAnswerStored():
            ids.append((thread, kind, event.run_id))
        case ExecutionStarted():
            ids.append((thread, kind, event.run_id, event.execution_id))
        case StepRecorded():  # each step of a run is recorded once
            ids.append((thread, kind, event.run_id, event.entry.step))
        case RunInterrupted():
            ids.append((thread, kind, event.run_id, event.step))
    return tuple(ids)


def dispatch_identities(envelope_id: str, thread_id: str, dispatch: Dispatch) -> tuple[Identity, ...]:
    """What makes a dispatch unique: its envelope id and its run attempt."""
    return (("envelope", envelope_id), (thread_id, dispatch.run_id, dispatch.attempt))


def message_identities(envelope_id: str, key: bytes, thread_id: str,
                       record: MessageRecord) -> tuple[Identity, ...]:
    """What makes a message record unique: its envelope id and its seq and run status."""
    status = record.run_status.value if record.run_status is not None else None
    return (("envelope", envelope_id, key), (thread_id, record.seq, status))


def dead_letter_identities(dead: DeadLetter) -> tuple[Identity, ...]:
    """What makes a dead letter unique: the source record and its error type."""
    return ((dead.source_topic, dead.source_partition, dead.source_offset, dead.error_type),)


# --- the checks ---------------------------------------------------------------------


Pairs = set[tuple[str, str]] | frozenset[tuple[str, str]]  # (message id, run id)


def audit_topics(reads: TopicReads, posts: Sequence[AcceptedPost], queued: Pairs = frozenset(),
                 regenerates: Pairs = frozenset(), edits: dict[str, str] | None = None
                 ) -> Findings:
    """Check `reads`; `posts` are the accepted posts that must be answered, in the
    order each thread's client posted them; `queued` the (message id, run id) of those
    posted with multitask_strategy enqueue (a run id too: two queued regenerates of
    one message are two runs); `regenerates` those that answer a stored message again;
    `edits` new message id -> the message it replaces."""
    findings = Findings()
    _once(reads.committed, findings)
    _aborted(reads, findings)
    _history(reads.history, posts, findings, queued, regenerates, edits or {})
    _states(reads, findings)
    return findings


def _once(records: list[TopicRecord], report: Findings) -> None:
    seen: dict[tuple[str, Identity], list[TopicRecord]] = defaultdict(list)
    for record in records:
        if record.topic in ONCE_TOPICS:
            for identity in record.identities:
                seen[(record.topic, identity)].append(record)
    for (topic, identity), copies in seen.items():
        if len(copies) > 1:
            where = ", ".join(f"{c.partition}@{c.offset}" for c in copies[:4])
            report._fail("duplicated", f"{topic}: {len(copies)} committed records with identity "
                         f"{identity!r} at {where} ({copies[0].what[:100]})")


def _aborted(reads: TopicReads, report: Findings) -> None:
    visible = {(r.topic, r.partition, r.offset) for r in reads.committed}
    if not reads.uncommitted:
        return
    read = {(r.topic, r.partition, r.offset) for r in reads.uncommitted}
    for topic, partition, offset in sorted(visible - read)[:20]:
        report._fail(None, f"{topic}: committed record {partition}@{offset} missing from the "
                     "read_uncommitted read (the reads do not cover the same log)")
    committed_ids = {(r.topic, i) for r in reads.committed for i in r.identities}
    # Only what the committed read got past is known to be aborted: a record after
    # its last one may belong to a transaction still open, or have come later.
    reached: dict[tuple[str, int], int] = {}
    for r in reads.committed:
        reached[(r.topic, r.partition)] = max(reached.get((r.topic, r.partition), -1), r.offset)
    for record in reads.uncommitted:
        if (record.topic, record.partition, record.offset) in visible \
                or record.offset > reached.get((record.topic, record.partition), -1):
            continue
        report.aborted += 1
        # An aborted batch is decided again, on the same committed state, so each of
        # its decisions has a committed twin with the same derived identity (the
        # envelope id may differ: a `RunRejected` has none derived, and is skipped).
        derived = [i for i in record.identities if i[0] != "envelope"]
        if record.topic in ONCE_TOPICS and derived and not any(
                (record.topic, i) in committed_ids for i in derived):
            report._fail("lost", f"{record.topic}: aborted record {record.partition}@"
                         f"{record.offset} ({record.what[:100]}) has no committed twin")


def _history(history: list[HistoryRecord], posts: Sequence[AcceptedPost], report: Findings,
             queued: Pairs = frozenset(), regenerates: Pairs = frozenset(),
             edits: dict[str, str] | None = None) -> None:
    by_thread: dict[str, list[HistoryRecord]] = defaultdict(list)
    for rec in sorted(history, key=lambda r: (r.partition, r.offset)):
        by_thread[rec.thread_id].append(rec)
    for thread_id, records in by_thread.items():
        seqs = {r.seq for r in records}
        if seqs != set(range(len(seqs))):
            missing = sorted(set(range(max(seqs) + 1)) - seqs)[:5]
            report._fail("gaps", f"history of {thread_id}: seqs {missing} missing")
    newest: dict[tuple[str, int], MessageRecord | None] = {}
    users: dict[tuple[str, str], set[int]] = defaultdict(set)  # (thread, message id) -> seqs
    answers: dict[tuple[str, str], set[int]] = defaultdict(set)  # (thread, run id) -> seqs
    for rec in sorted(history, key=lambda r: (r.partition, r.offset)):
        newest[(rec.thread_id, rec.seq)] = rec.record
        if rec.record is not None:
            message = rec.record.message
            if message.role == "assistant":
                answers[(rec.thread_id, message.run_id)].add(rec.seq)
            else:
                users[(rec.thread_id, message.message_id)].add(rec.seq)
    last_seq: dict[str, int] = {}
    for post in posts:
        user_seqs = users.get((post.thread_id, post.message_id), set())
        answer_seqs = answers.get((post.thread_id, post.run_id), set())
        if len(user_seqs) != 1 or len(answer_seqs) != 1:
            counter = "duplicated" if len(user_seqs) > 1 or len(answer_seqs) > 1 else "lost"
            report._fail(counter, f"history of {post.thread_id}: message {post.message_id} at "
                         f"seqs {sorted(user_seqs)}, its answer at {sorted(answer_seqs)}")
            continue
        (seq,), (answer_seq,) = user_seqs, answer_seqs
        user, answer = newest[(post.thread_id, seq)], newest[(post.thread_id, answer_seq)]
        if (post.message_id, post.run_id) in regenerates:
            # Answered again: the question stands at an older seq and the new answer
            # at the next free one, linked to it (whatever stands between is other
            # branches'); the question's record keeps its own run's status.
            if answer is None or answer_seq <= seq or not _linked(answer, seq, post.thread_id,
                                                                  newest, queued):
                report._fail("gaps", f"history of {post.thread_id}: regenerate {post.run_id} "
                             f"of the message at seq {seq}: its answer at {answer_seq} is "
                             "linked elsewhere (off its branch)")
            if answer is None or answer.message.run_id != post.run_id:
                report._fail("lost", f"history of {post.thread_id}: seq {answer_seq} ends as "
                             f"something other than the answer of run {post.run_id}")
            continue
        if answer_seq == seq + 1 and answer is not None and parent_seq_of(answer) != seq:
            report._fail("gaps", f"history of {post.thread_id}: the answer of run {post.run_id} "
                         f"at seq {answer_seq} is linked to seq {parent_seq_of(answer)}, not its "
                         f"message at {seq} (off its branch)")
        replaced = (edits or {}).get(post.message_id)
        if replaced is not None and user is not None:
            old_seqs = users.get((post.thread_id, replaced), set())
            old = newest.get((post.thread_id, min(old_seqs))) if len(old_seqs) == 1 else None
            if old is None or parent_seq_of(old) != parent_seq_of(user):
                report._fail("gaps", f"history of {post.thread_id}: edit {post.message_id} at "
                             f"seq {seq} is not beside the message it replaces, {replaced}")
        # Between a message and its answer only messages queued meanwhile (enqueue)
        # and the partial answer of the run it interrupted may stand; a queued
        # message's own answer follows the runs before it.
        between = [newest.get((post.thread_id, s)) for s in range(seq + 1, answer_seq)]
        if answer_seq <= seq or ((post.message_id, post.run_id) not in queued and not all(
                r is not None and ((r.message.role == "user" and
                                    (r.message.message_id, r.message.run_id) in queued)
                                   or _partial(r))
                for r in between)):
            report._fail("gaps", f"history of {post.thread_id}: message {post.message_id} at "
                         f"seq {seq}, its answer at {answer_seq}")
        if user is None or user.message.role != "user" or user.run_status is None \
                or user.run_status.value != "completed":
            status = user.run_status if user is not None else "a tombstone"
            report._fail("lost", f"history of {post.thread_id}: message {post.message_id} "
                         f"at seq {seq} ends with run status {status}")
        if answer is None or answer.message.run_id != post.run_id:
            report._fail("lost", f"history of {post.thread_id}: seq {answer_seq} ends as "
                         f"something other than the answer of run {post.run_id}")
        if seq <= last_seq.get(post.thread_id, -1):
            report._fail("gaps", f"history of {post.thread_id}: message {post.message_id} at "
                         f"seq {seq}, before a message posted earlier")
        last_seq[post.thread_id] = seq


def _linked(answer: MessageRecord, seq: int, thread_id: str,
            newest: dict[tuple[str, int], MessageRecord | None], queued: Pairs) -> bool:
    """Whether `answer`'s parent links reach the message at `seq` past only messages
    queued meanwhile (enqueue: stored at once on the branch, before the running answer)."""
    parent = parent_seq_of(answer)
    while parent > seq:
        record = newest.get((thread_id, parent))
        if record is None or record.message.role != "user" or \
                (record.message.message_id, record.message.run_id) not in queued:
            return False
        parent = parent_seq_of(record)
    return parent == seq


def _partial(record: MessageRecord) -> bool:
    """An interrupted run's partial answer (PartialAnswerStored): marked cancelled."""
    return record.message.role == "assistant" and record.run_status is RunStatus.CANCELLED


def _states(reads: TopicReads, report: Findings) -> None:
    runs = Counter(thread for thread, e in reads.events if isinstance(e, RunAccepted))
    seqs: dict[str, set[int]] = defaultdict(set)
    for rec in reads.history:
        seqs[rec.thread_id].add(rec.seq)
    newest: dict[str, ThreadState | None] = {}
    counters: dict[str, tuple[int, int]] = {}
    for written in sorted(reads.states, key=lambda r: (r.partition, r.offset)):
        thread_id, state = written.thread_id, written.state
        newest[thread_id] = state
        if state is None:
            continue
        now = (state.message_count, state.run_count)
        before = counters.get(thread_id, (0, 0))
        if now[0] < before[0] or now[1] < before[1]:
            report._fail("duplicated", f"threads: state of {thread_id} at {written.partition}@"
                         f"{written.offset} goes back from {before} to {now} messages/runs")
        counters[thread_id] = now
    for thread_id, state in newest.items():
        if state is None:
            continue
        if state.message_count != len(seqs[thread_id]) or state.run_count != runs[thread_id]:
            report._fail(None, f"threads: newest state of {thread_id} counts {state.message_count}"
                         f" messages and {state.run_count} runs; the history has "
                         f"{len(seqs[thread_id])}, the events {runs[thread_id]} runs")
        if state.active_run is not None:
            report._fail("stuck", f"threads: {thread_id} still has run {state.active_run.run_id} "
                         "active after the drain")
