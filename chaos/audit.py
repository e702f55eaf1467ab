"""The audit: what the clients saw, the topics hold and the API serves, checked.

Pure: `audit(observations)` reads plain data and returns a `Report`; nothing here
talks to Kafka or HTTP, so each check can be shown to fail on made-up data.

The checks, for every message a client saw accepted (202, `pending` too):

* the events topic holds exactly one `MessageAccepted` and one `RunAccepted`
  for it (no run started twice) and exactly one terminal event, a
  `RunCompleted` (a failed or cancelled run left the message unanswered);
* the API stores it once and exactly one assistant answer for its run, whose
  text is the `RunCompleted` text (`lost` if none, `duplicated` if more);
* the reference replay of the run (`GET /v1/runs/{id}/events` from the start,
  after the chaos) ends with exactly one terminal event and `done`, and the text
  its last execution streamed is the stored answer;
* every watcher that followed the run saw exactly the reference's events, in
  order: an event of the reference it did not see is a gap, an event seen twice
  or not in the reference a duplicate, and it saw exactly one terminal event. A
  watcher told `message_not_streaming` that then read the answer over REST is
  complete;
* what only exactly-once promises, on the topics (`chaos.topic_audit`): every
  record of `events`, `dispatch`, `messages` and `dead-letter` once, no aborted
  record visible, and each answered message's history whole and in order;
* double-texting (docs/multitask.md): on each thread the runs start in the order
  their messages were posted, and never while another run of the thread is open
  (at most one active run); an interrupted run (`RunCancelled`, reason
  `interrupted`) is one a later post of the client asked to interrupt, it ends
  before that post's run starts, and its message is stored without an answer or
  with the partial answer its worker reported, marked (`interrupted`, not lost);
  a rolled-back run's message is counted as answered-then-removed (`rolled_back`):
  it must be gone from the stored history, not lost; an enqueued message is
  answered once like any other, in order (`enqueued` counts them);
* regenerates and edits (issue #30, `chaos.branch_audit`): each answered once, on
  its branch, a regenerate's key naming one run however often it was sent; the
  stored history read is every branch's (`GET .../branches`, then `?branch=`), so
  an answer left on an older branch is not lost (`regenerated`, `edited` count them);
* and overall: no two equal decisions in the events topic (decisions are pure
  functions of their commands, so any duplicate shows as an equal pair), nothing
  dead-lettered, no 500 answered, nothing waiting past its deadline.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from chaos.branch_audit import audit_branches
from chaos.tools_audit import audit_tools
from chaos.topic_audit import TopicReads, audit_topics
from streams.core.domain import (
    Event,
    MessageAccepted,
    PartialAnswerStored,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunFailed,
)
from streams.core.lifecycle import TERMINAL
from streams.core.reasons import CancelReason

__all__ = ["Observations", "Post", "Report", "Seen", "WatchLog", "audit"]




@dataclass(frozen=True, slots=True)
class Seen:
    """One SSE event as a client received it."""

    id: str
    event: str
    data: str

    @property
    def fields(self) -> dict[str, object]:
        """The event's data as a JSON object, or {} if it is not one."""
        try:
            value = json.loads(self.data)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(slots=True)
class Post:
    """One user message a client posted, and what it learned of it."""

    thread_id: str
    message_id: str
    run_id: str
    accepted: bool = False  # a 202, accepted, pending or replayed
    statuses: list[int] = field(default_factory=list)  # every answer, in order
    accepted_at: float | None = None  # monotonic
    ended_at: float | None = None  # when the client learned the run ended
    strategy: str = "reject"  # its multitask_strategy
    interrupts: str | None = None  # interrupt: the run it was posted to cancel
    # Branches (issue #30, chaos.branch_audit): "post", "regenerate" (`message_id` is the
    # question answered again, `run_id` the regenerate's run) or "edit" (`message_id`
    # the new message, `edits` the one it replaces).
    kind: str = "post"
    edits: str | None = None
    run_ids: list[str] = field(default_factory=list)  # the run each 202 named, in order
    key_resent: bool = False  # a regenerate whose key was sent again once accepted


# The accepted posts by (message id, run id): a message's own run, or a regenerate's.
_Accepted = dict[tuple[str, str], Post]


@dataclass(slots=True)
class WatchLog:
    """What one SSE client saw: a thread stream (runs of a thread) or a run stream."""

    name: str
    thread_id: str
    run_id: str | None = None  # a run stream; None: the thread stream
    runs: dict[str, list[Seen]] = field(default_factory=lambda: defaultdict(list))
    not_streaming: set[str] = field(default_factory=set)  # completed over REST instead
    unwatched: set[str] = field(default_factory=set)  # could not be followed at all
    connects: int = 0
    cuts: int = 0  # deliberate ones
    max_reconnect_s: float = 0.0  # longest time from a lost connection to the next one
    trail: list[str] = field(default_factory=list)  # connections, for a post-mortem


@dataclass(slots=True)
class Observations:
    """Everything the run collected for the audit: posts, events, stored answers, streams, topics."""
    posts: list[Post]
    events: list[Event]  # the events topic, read_committed, in partition order
    stored: dict[str, list[dict[str, object]]]  # thread id -> every branch's messages, by seq
    references: dict[str, list[Seen]]  # run id -> uninterrupted replay
    watchers: list[WatchLog]
    dead_letters: int = 0
    server_errors: list[str] = field(default_factory=list)  # 500s answered
    stuck: list[str] = field(default_factory=list)  # waits that passed their deadline
    topics: TopicReads | None = None  # the transactional topics; None: not audited
    tool_log: list[str] | None = None  # the builtin tool's side-effect log; None: not audited
    # thread id -> branch -> its seqs root first (GET .../messages?branch=); None: not read
    paths: dict[str, dict[int, list[int]]] | None = None


@dataclass(slots=True)
class Report:
    """The audit's counts and its list of violations."""
    threads: int = 0
    messages: int = 0
    accepted: int = 0
    conflicts: int = 0
    answered: int = 0
    lost: int = 0
    duplicated: int = 0
    gaps: int = 0
    stuck: int = 0
    watched_runs: int = 0
    unwatched: int = 0  # runs a thread watcher could not follow (not a violation)
    cut_short: int = 0  # runs whose last streamed execution lost the race to report
    enqueued: int = 0  # messages posted with multitask_strategy enqueue
    interrupted: int = 0  # runs cancelled by a later post's interrupt (not a violation)
    rolled_back: int = 0  # runs rolled back: answered-then-removed (not a violation)
    aborted: int = 0  # records of aborted transactions (hidden from read_committed readers)
    tool_calls: int = 0  # tool functions entered (chaos.tools_audit)
    tool_duplicates: int = 0  # completed tool calls made again: violations
    regenerated: int = 0  # regenerates accepted (issue #30)
    edited: int = 0  # edits accepted (issue #30)
    keys_resent: int = 0  # regenerates whose key was sent twice (one run each)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the audit found no violation."""
        return not self.violations

    def _fail(self, counter: str | None, text: str) -> None:
        if counter is not None:
            setattr(self, counter, getattr(self, counter) + 1)
        self.violations.append(text)


def _count(items: Iterable[str]) -> Counter[str]:
    return Counter(items)


def audit(obs: Observations) -> Report:
    """Check every observation of a run and return the report."""
    report = Report(threads=len({p.thread_id for p in obs.posts}),
                    messages=len({p.message_id for p in obs.posts}))
    report.conflicts = sum(s == 409 for p in obs.posts for s in p.statuses)
    # By message and run: two regenerates of one message are two runs, not a duplicate.
    accepted = {(p.message_id, p.run_id): p for p in obs.posts if p.accepted}
    report.accepted = len(accepted)
    report.enqueued = sum(p.strategy == "enqueue" for p in accepted.values())
    report.regenerated = sum(p.kind == "regenerate" for p in accepted.values())
    report.edited = sum(p.kind == "edit" for p in accepted.values())
    report.keys_resent = sum(p.key_resent for p in accepted.values())
    superseded = _audit_double_texts(obs, accepted, report)
    _audit_decisions(obs, accepted, report, superseded)
    answers = _audit_stored(obs, accepted, report, superseded)
    for counter, text in audit_branches(list(accepted.values()), obs.events, obs.stored,
                                        obs.paths, superseded,
                                        {p.message_id for p in accepted.values()
                                         if p.strategy == "enqueue"}):
        report._fail(counter, text)
    for post in accepted.values():
        _audit_reference(obs.references.get(post.run_id), post, answers.get(post.run_id), report)
    for log in obs.watchers:
        _audit_watcher(log, obs, accepted, answers, report)
    if obs.topics is not None:
        findings = audit_topics(obs.topics, [p for p in accepted.values()
                                             if p.run_id not in superseded],
                                queued={(p.message_id, p.run_id) for p in accepted.values()
                                        if p.strategy == "enqueue"},
                regenerates={(p.message_id, p.run_id) for p in accepted.values()
                             if p.kind == "regenerate"},
                edits={p.message_id: p.edits for p in accepted.values()
                       if p.kind == "edit" and p.edits is not None})
        report.aborted = findings.aborted
        for counter, text in findings.violations:
            report._fail(counter, text)
    if obs.dead_letters:
        report._fail(None, f"{obs.dead_letters} records dead-lettered during the run")
    for error in obs.server_errors:
        report._fail(None, f"server error: {error}")
    for what in obs.stuck:
        report._fail("stuck", f"waited forever: {what}")
    if obs.tool_log is not None:
        tools = audit_tools(obs.tool_log, obs.events,
                            obs.topics.step_decided_ms if obs.topics is not None else None)
        report.tool_calls, report.tool_duplicates = tools.executions, tools.duplicates
        report.violations += tools.violations
    return report


def _audit_double_texts(obs: Observations, accepted: _Accepted,
                        report: Report) -> dict[str, str]:
    """Check the order of runs on each thread and the runs other posts cancelled;
    return run id -> reason for the runs rightly left unanswered (interrupted or
    rolled back)."""
    by_thread: defaultdict[str, list[Event]] = defaultdict(list)
    for event in obs.events:
        by_thread[event.thread_id].append(event)
    interrupters = {p.interrupts: p for p in accepted.values() if p.interrupts is not None}
    superseded: dict[str, str] = {}
    for thread_id, events in by_thread.items():
        open_runs: set[str] = set()
        started: list[str] = []
        for index, event in enumerate(events):
            if isinstance(event, RunAccepted):
                if open_runs:
                    report._fail("duplicated", f"thread {thread_id}: run {event.run_id} started "
                                 f"while {sorted(open_runs)} was active")
                open_runs.add(event.run_id)
                started.append(event.run_id)
            elif isinstance(event, RunCompleted | RunFailed | RunCancelled):
                open_runs.discard(event.run_id)
            if not isinstance(event, RunCancelled) or event.reason not in (CancelReason.INTERRUPTED,
                                                                            CancelReason.ROLLED_BACK):
                continue
            superseded[event.run_id] = event.reason
            if event.reason == CancelReason.ROLLED_BACK:
                report.rolled_back += 1
                continue
            report.interrupted += 1
            by = interrupters.get(event.run_id)
            if by is None:
                report._fail(None, f"run {event.run_id} interrupted, but no client asked to")
                continue
            later = [e for e in events[index + 1:]
                     if isinstance(e, RunAccepted) and e.run_id == by.run_id]
            if not later:
                report._fail("gaps", f"run {event.run_id} interrupted; the run of "
                             f"{by.message_id} did not start after it ended")
        posted = [p.run_id for p in accepted.values() if p.thread_id == thread_id]
        ran = [r for r in started if r in set(posted)]
        if ran != [r for r in posted if r in set(ran)]:
            report._fail("gaps", f"thread {thread_id}: runs started out of posting order")
    return superseded


def _audit_decisions(obs: Observations, accepted: _Accepted, report: Report,
                     superseded: dict[str, str]) -> None:
    messages = _count(e.message_id for e in obs.events if isinstance(e, MessageAccepted))
    runs = _count(e.run_id for e in obs.events if isinstance(e, RunAccepted))
    ends: defaultdict[str, list[Event]] = defaultdict(list)
    for event in obs.events:
        if isinstance(event, RunCompleted | RunFailed | RunCancelled):
            ends[event.run_id].append(event)
    for post in accepted.values():
        if messages[post.message_id] != 1:
            counter = "lost" if messages[post.message_id] == 0 else "duplicated"
            report._fail(counter, f"message {post.message_id}: {messages[post.message_id]} "
                         "MessageAccepted decisions")
        if runs[post.run_id] > 1:
            report._fail("duplicated", f"run {post.run_id} started {runs[post.run_id]} times")
        finals = ends.get(post.run_id, [])
        if len(finals) > 1:
            report._fail("duplicated", f"run {post.run_id} ended {len(finals)} times")
        elif post.run_id in superseded:
            continue  # cancelled by a later post's interrupt or rollback, checked above
        elif not finals or not isinstance(finals[0], RunCompleted):
            what = type(finals[0]).__name__ if finals else "no terminal event"
            report._fail("lost", f"run {post.run_id} of an accepted message: {what}")
    for text, n in _count(repr(e) for e in obs.events).items():
        if n > 1:
            report._fail("duplicated", f"decision repeated {n} times: {text[:160]}")
    unseen = set(runs) - {p.run_id for p in accepted.values()}
    for run_id in sorted(unseen):  # accepted although no client saw a 202: not lost, noted
        if not any(p.run_id == run_id for p in obs.posts):
            report._fail(None, f"run {run_id} accepted for a message no client posted")


def _audit_stored(obs: Observations, accepted: _Accepted, report: Report,
                  superseded: dict[str, str]) -> dict[str, str]:
    """Check the stored messages; return run id -> stored answer text."""
    completed = {e.run_id: e.message.text for e in obs.events if isinstance(e, RunCompleted)}
    partials = {e.run_id: e.message.text for e in obs.events
                if isinstance(e, PartialAnswerStored)}
    answers: dict[str, str] = {}
    for post in accepted.values():
        messages = obs.stored.get(post.thread_id, [])
        users = [m for m in messages if m.get("message_id") == post.message_id]
        replies = [m for m in messages if m.get("role") == "assistant"
                   and m.get("run_id") == post.run_id]
        if superseded.get(post.run_id) == CancelReason.ROLLED_BACK:
            if users or replies:  # answered-then-removed: the history no longer has it
                report._fail(None, f"message {post.message_id} was rolled back but is stored")
            continue
        if len(users) != 1:
            report._fail("lost" if not users else "duplicated",
                         f"message {post.message_id} stored {len(users)} times")
        if post.run_id in superseded:  # interrupted: the question stays, and at most
            # the answer streamed so far, marked (its worker may have been gone)
            if len(replies) > 1 or any(not r.get("partial") for r in replies):
                report._fail("duplicated", f"run {post.run_id} was interrupted but has "
                             f"{len(replies)} stored answers, not one partial at most")
            elif replies and partials.get(post.run_id) != replies[0].get("text"):
                report._fail(None, f"run {post.run_id}: stored partial answer differs from "
                             "PartialAnswerStored")
            continue
        if not replies:
            report._fail("lost", f"run {post.run_id}: no stored answer")
            continue
        if len(replies) > 1:
            report._fail("duplicated", f"run {post.run_id}: {len(replies)} stored answers")
            continue
        text = str(replies[0].get("text"))
        if post.run_id in completed and completed[post.run_id] != text:
            report._fail(None, f"run {post.run_id}: stored answer differs from RunCompleted")
        answers[post.run_id] = text
        report.answered += 1
    return answers


def _terminals(seen: list[Seen]) -> int:
    return sum(s.event in TERMINAL for s in seen)


def final_text(seen: list[Seen]) -> tuple[str, bool] | None:
    """The text the run's last execution streamed (the deltas after the last
    `message_start` of the attempt that ended the run), and whether that execution
    got to its `message_end` before the run's terminal event."""
    terminal = next((s for s in reversed(seen) if s.event in TERMINAL), None)
    if terminal is None:
        return None
    attempt = terminal.fields.get("attempt")
    starts = [i for i, s in enumerate(seen)
              if s.event == "message_start" and s.fields.get("attempt") == attempt]
    if not starts:
        return None
    last = seen[starts[-1]:]
    text = "".join(str(s.fields.get("delta", "")) for s in last if s.event == "text_delta")
    return text, any(s.event == "message_end" for s in last)


def _answer_in(terminal: Seen) -> str | None:
    message = terminal.fields.get("message")
    return str(message.get("text")) if isinstance(message, dict) else None


def _audit_reference(ref: list[Seen] | None, post: Post, answer: str | None,
                     report: Report) -> None:
    run = post.run_id
    if not ref:
        report._fail("gaps", f"run {run}: no reference replay")
        return
    if _terminals(ref) != 1 or ref[-1].event != "done" or sum(s.event == "done" for s in ref) != 1:
        report._fail("gaps", f"run {run}: the reference replay has {_terminals(ref)} terminal "
                     f"events and ends with {ref[-1].event}")
    if len({s.id for s in ref}) != len(ref):
        report._fail("duplicated", f"run {run}: the reference replay repeats an event id")
    terminal = next((s for s in ref if s.event in TERMINAL), None)
    if answer is not None and terminal is not None and _answer_in(terminal) != answer:
        report._fail("gaps", f"run {run}: {terminal.event} does not carry the stored answer")
    streamed = final_text(ref)
    if answer is None or streamed is None or streamed[0] == answer:
        return
    if streamed[1]:  # a whole execution whose deltas do not add up to the answer
        report._fail("gaps", f"run {run}: the last execution streamed {len(streamed[0])} "
                     f"characters, the stored answer has {len(answer)}")
    else:  # cut off by the run's end: another execution of the attempt reported first
        report.cut_short += 1


def _audit_watcher(log: WatchLog, obs: Observations, accepted: _Accepted,
                   answers: dict[str, str], report: Report) -> None:
    if log.run_id is not None:
        expected = {log.run_id}
    else:
        expected = {p.run_id for p in accepted.values() if p.thread_id == log.thread_id}
    for run in sorted(expected | set(log.runs)):
        if run in log.unwatched and not log.runs.get(run):
            report.unwatched += 1
            continue
        seen = log.runs.get(run, [])
        if run in log.not_streaming:
            if run not in answers:
                report._fail("lost", f"{log.name}: run {run} not streaming and not stored")
            continue
        ref = obs.references.get(run)
        if ref is None:
            report._fail("gaps", f"{log.name}: saw run {run}, which has no reference")
            continue
        report.watched_runs += 1
        ids = [s.id for s in seen]
        repeated = [i for i, n in _count(ids).items() if n > 1]
        known = {s.id for s in ref}
        extra = [s for s in seen if s.id not in known]
        missing = [s for s in ref if s.id not in set(ids)]
        if repeated or extra:
            report._fail("duplicated", f"{log.name}: run {run}: {len(repeated)} events seen "
                         f"twice, {len(extra)} not in the reference "
                         f"({[s.event for s in extra][:5]})")
        if missing:
            report._fail("gaps", f"{log.name}: run {run}: {len(missing)} events missing "
                         f"({[s.event for s in missing][:5]})")
        elif not repeated and not extra and seen != ref:
            report._fail("gaps", f"{log.name}: run {run}: events out of order or altered")
        if _terminals(seen) != 1:
            report._fail(None, f"{log.name}: run {run}: {_terminals(seen)} terminal events")
