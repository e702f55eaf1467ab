"""The chaos audit catches what it claims to: each check fails on data that breaks it."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from chaos.audit import Observations, Post, Seen, WatchLog, audit, final_text
from chaos.load import run_of
from chaos.topic_audit import (
    HistoryRecord,
    StateRecord,
    TopicReads,
    TopicRecord,
    dispatch_identities,
    event_identities,
    message_identities,
)
from streams.core.domain import (
    ActiveRun,
    AssistantMessage,
    AttemptDispatched,
    Event,
    MessageAccepted,
    MessageQueued,
    RejectReason,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunRejected,
    RunStatus,
    StoredMessage,
    ThreadState,
)
from streams.core.history import message_key
from streams.core.reasons import CancelReason
from streams.core.records import Dispatch, MessageRecord

THREAD, MESSAGE, RUN = "th-1", "msg-1", "run-1"
ANSWER = "You said: hi. amber river."


def _id(offset: int, sub: int = 0) -> str:
    return base64.urlsafe_b64encode(f"v1.2.{offset}.{sub}.10.{RUN}".encode()).decode().rstrip("=")


def _seen(offset: int, event: str, attempt: int = 1, sub: int = 0, **fields: object) -> Seen:
    data = "[DONE]" if event == "done" else json.dumps(
        {"thread_id": THREAD, "run_id": RUN, "attempt": attempt, **fields})
    return Seen(_id(offset, sub), event, data)


def _reference() -> list[Seen]:
    """Attempt 1 cut short by a kill, attempt 2 streams the whole answer."""
    return [
        _seen(10, "run_accepted"), _seen(11, "attempt_dispatched"),
        _seen(12, "message_start"), _seen(13, "text_start"), _seen(14, "text_delta", delta="You"),
        _seen(20, "retry_scheduled"), _seen(21, "attempt_dispatched", attempt=2),
        _seen(22, "message_start", attempt=2), _seen(23, "text_start", attempt=2),
        _seen(24, "text_delta", attempt=2, delta="You said: hi."),
        _seen(25, "text_delta", attempt=2, delta=" amber river."),
        _seen(26, "text_end", attempt=2, text=ANSWER), _seen(27, "message_end", attempt=2),
        _seen(28, "run_completed", attempt=2, message={"message_id": "answer-1", "text": ANSWER}),
        _seen(28, "done", sub=1),
    ]


def _clean() -> Observations:
    post = Post(THREAD, MESSAGE, RUN, accepted=True, statuses=[409, 202])
    events: list[Event] = [
        MessageAccepted(THREAD, MESSAGE, "hi", "m-0", 1), RunAccepted(THREAD, RUN, "wf", MESSAGE, 1),
        AttemptDispatched(THREAD, RUN, MESSAGE, 1, 1), AttemptDispatched(THREAD, RUN, MESSAGE, 2, 2),
        RunCompleted(THREAD, RUN, 2, AssistantMessage("answer-1", ANSWER), 3),
    ]
    stored: list[dict[str, object]] = [
        {"message_id": MESSAGE, "role": "user", "text": "hi", "run_id": RUN},
        {"message_id": "answer-1", "role": "assistant", "text": ANSWER, "run_id": RUN},
    ]
    reference = _reference()
    thread_watcher = WatchLog("thread-watcher", THREAD)
    thread_watcher.runs[RUN] = list(reference)
    run_watcher = WatchLog("run-watcher", THREAD, RUN)
    run_watcher.runs[RUN] = list(reference)
    return Observations(posts=[post], events=events, stored={THREAD: stored},
                        references={RUN: reference}, watchers=[thread_watcher, run_watcher])


def test_a_clean_run_passes_and_counts() -> None:
    """The audit passes a clean run and counts its posts, answers, conflicts and watched runs."""
    report = audit(_clean())
    assert report.ok, report.violations
    assert (report.accepted, report.answered, report.conflicts, report.watched_runs) == (1, 1, 1, 2)
    assert final_text(_reference()) == (ANSWER, True)


def _watcher(obs: Observations) -> list[Seen]:
    return obs.watchers[0].runs[RUN]


Breakage = Callable[[Observations], object]

BREAKAGES: dict[str, tuple[Breakage, str]] = {
    "a watcher missed a delta across a reconnect": (
        lambda o: _watcher(o).pop(9), "gaps"),
    "a watcher saw an event twice": (
        lambda o: _watcher(o).insert(10, _watcher(o)[9]), "duplicated"),
    "a watcher saw events out of order": (
        lambda o: _watcher(o).insert(9, _watcher(o).pop(10)), "gaps"),
    "a watcher never saw the end": (
        lambda o: _watcher(o).__delitem__(slice(-2, None)), "gaps"),
    "a watcher saw an event the reference does not have": (
        lambda o: _watcher(o).insert(3, _seen(15, "text_delta", delta="?")), "duplicated"),
    "a run started twice": (
        lambda o: o.events.append(RunAccepted(THREAD, RUN, "wf", MESSAGE, 9)), "duplicated"),
    "a run completed twice": (
        lambda o: o.events.append(RunCompleted(THREAD, RUN, 2, AssistantMessage("a", "x"), 4)),
        "duplicated"),
    "an equal decision written twice": (
        lambda o: o.events.append(o.events[2]), "duplicated"),
    "an accepted message was never decided": (
        lambda o: o.events.__delitem__(0), "lost"),
    "an accepted run failed": (
        lambda o: o.events.__setitem__(4, RunFailed(THREAD, RUN, 2, "boom", 3)), "lost"),
    "the answer was never stored": (
        lambda o: o.stored[THREAD].pop(), "lost"),
    "the answer was stored twice": (
        lambda o: o.stored[THREAD].append(dict(o.stored[THREAD][1])), "duplicated"),
    "the stream lost a delta the answer has": (
        lambda o: o.references[RUN].pop(10), "gaps"),
    "the terminal event carries another answer": (
        lambda o: o.references[RUN].__setitem__(13, _seen(
            28, "run_completed", attempt=2, message={"message_id": "answer-1", "text": "?"})),
        "gaps"),
    "something waited forever": (
        lambda o: o.stuck.append("run-watcher: still waiting"), "stuck"),
}


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_the_audit_catches(name: str) -> None:
    """The audit flags each kind of deliberate breakage under its own counter."""
    breakage, counter = BREAKAGES[name]
    obs = copy.deepcopy(_clean())
    breakage(obs)
    report = audit(obs)
    assert not report.ok, name
    assert getattr(report, counter) >= 1, (name, counter, report.violations)


def test_dead_letters_and_server_errors_are_violations() -> None:
    """Dead letters and 5xx answers are each a violation."""
    obs = _clean()
    obs.dead_letters = 1
    obs.server_errors.append("POST /v1/threads: 500")
    assert len(audit(obs).violations) == 2


def test_a_watcher_told_not_streaming_is_complete_if_the_answer_is_stored() -> None:
    """A watcher told message_not_streaming is complete only if the answer was stored."""
    obs = _clean()
    obs.watchers[0].runs[RUN] = obs.watchers[0].runs[RUN][:5]  # then message_not_streaming
    obs.watchers[0].not_streaming.add(RUN)
    assert audit(obs).ok
    obs.stored[THREAD].pop()
    assert audit(obs).lost >= 1


def test_a_run_the_thread_watcher_could_not_follow_is_not_a_gap_unless_it_saw_part_of_it() -> None:
    """A run a watcher could not follow is no gap, unless it saw part of it."""
    obs = _clean()
    obs.watchers[0].runs.clear()
    obs.watchers[0].unwatched.add(RUN)
    assert audit(obs).ok
    obs.watchers[0].runs[RUN] = _reference()[:4]
    assert audit(obs).gaps >= 1


def test_a_pending_post_that_was_never_decided_is_lost() -> None:
    """A post answered 202 pending whose run never appears counts as lost."""
    obs = _clean()
    obs.posts.append(Post(THREAD, "msg-2", "run-2", accepted=True, statuses=[202]))
    report = audit(obs)
    assert report.lost >= 1 and report.accepted == 2


def test_the_run_of_a_done_event_is_read_from_its_id() -> None:
    """The run of any seen event, done included, is read from its event id."""
    assert run_of(_seen(28, "done", sub=1)) == RUN
    assert run_of(_seen(12, "message_start")) == RUN


def test_a_last_execution_cut_off_by_another_one_reporting_first_is_counted_not_failed() -> None:
    """Attempt 2 ran twice (its dispatch redelivered before the first execution's
    report was decided): the second execution's stream is cut off by run_completed,
    which carries the first one's whole answer."""
    obs = _clean()
    second = [_seen(29, "message_start", attempt=2), _seen(30, "text_start", attempt=2),
              _seen(31, "text_delta", attempt=2, delta="You said")]
    reference = obs.references[RUN]
    reference[13:13] = second
    for watcher in obs.watchers:
        watcher.runs[RUN] = list(reference)
    report = audit(obs)
    assert report.ok, report.violations
    assert report.cut_short == 1


# --- what exactly-once adds: the topics -------------------------------------------------

def _answer() -> StoredMessage:
    return StoredMessage("answer-1", "assistant", ANSWER, RUN, 3)


def _user() -> StoredMessage:
    return StoredMessage(MESSAGE, "user", "hi", RUN, 1)


def _event_record(offset: int, envelope_id: str, event: Event) -> TopicRecord:
    return TopicRecord("events", 0, offset, event_identities(envelope_id, event), repr(event))


def _message_record(offset: int, envelope_id: str, record: MessageRecord) -> tuple[
        TopicRecord, HistoryRecord]:
    key = message_key(THREAD, record.seq)
    return (TopicRecord("messages", 0, offset, message_identities(envelope_id, key, THREAD, record)),
            HistoryRecord(THREAD, record.seq, 0, offset, record))


def _topics(events: list[Event]) -> TopicReads:
    """The clean run's topics: one transaction per command (post; retry tick; report),
    envelope ids derived from the command's as the processor does."""
    envelope = ["post/0", "post/1", "post/2", "tick/0", "report/0"]
    reads = TopicReads(events=[(THREAD, e) for e in events])
    reads.committed = [_event_record(i, envelope[i], e) for i, e in enumerate(events)]
    reads.committed += [
        TopicRecord("dispatch", 0, 0, dispatch_identities("post/2", THREAD, _dispatch(1))),
        TopicRecord("dispatch", 0, 1, dispatch_identities("tick/0", THREAD, _dispatch(2))),
        TopicRecord("threads", 0, 0, ()), TopicRecord("threads", 0, 1, ()),
        TopicRecord("threads", 0, 2, ()),
    ]
    writes = [_message_record(0, "post/0", MessageRecord(0, _user(), RunStatus.DISPATCHED)),
              _message_record(1, "report/0", MessageRecord(1, _answer(), None)),
              _message_record(2, "report/0", MessageRecord(0, _user(), RunStatus.COMPLETED, 2))]
    reads.committed += [topic for topic, _ in writes]
    reads.history = [history for _, history in writes]
    base = ThreadState(THREAD, "t", "title", 0)
    run = ActiveRun(RUN, MESSAGE, 1, RunStatus.DISPATCHED, 1, 1, None, 0, 1)
    reads.states = [StateRecord(THREAD, 0, 0, replace(base, message_count=1, run_count=1,
                                                      active_run=run)),
                    StateRecord(THREAD, 0, 1, replace(base, message_count=1, run_count=1,
                                                      active_run=replace(run, attempt=2))),
                    StateRecord(THREAD, 0, 2, replace(base, message_count=2, run_count=1))]
    return reads


def _dispatch(attempt: int) -> Dispatch:
    return Dispatch(RUN, MESSAGE, attempt, "wf", "hi", (), 1)


def _with_topics() -> Observations:
    obs = _clean()
    obs.topics = _topics(obs.events)
    return obs


def _reads(o: Observations) -> TopicReads:
    assert o.topics is not None
    return o.topics


def _replayed(o: Observations, index: int) -> None:
    """The committed record `index` written again by a replayed batch (at least once)."""
    reads = _reads(o)
    copy_ = reads.committed[index]
    reads.committed.append(replace(copy_, offset=copy_.offset + 100))


def _rejected_under_the_accepted_id(o: Observations) -> None:
    """The post replayed after its state advanced: a RunRejected under the
    MessageAccepted's derived envelope id."""
    rejected = RunRejected(THREAD, MESSAGE, RejectReason.DUPLICATE, "message id already has a run",
                           RUN, 1)
    _reads(o).committed.append(_event_record(50, "post/0", rejected))


def _aborted_without_twin(o: Observations) -> None:
    """A read_uncommitted record that nothing committed repeats: an aborted decision
    no retry made."""
    reads = _reads(o)
    reads.uncommitted = list(reads.committed)
    reads.uncommitted.append(TopicRecord("dispatch", 0, 7, dispatch_identities(
        "x/0", THREAD, _dispatch(3))))
    _committed_later(reads, "dispatch")


def _committed_later(reads: TopicReads, topic: str) -> None:
    """A committed record after everything else on `topic`: the committed read got
    past what came before, so an uncommitted-only record there was aborted."""
    reads.committed.append(TopicRecord(topic, 0, 500, ()))
    reads.uncommitted.append(TopicRecord(topic, 0, 500, ()))


def _history_twice(o: Observations) -> None:
    reads = _reads(o)
    record = MessageRecord(2, _answer(), None)
    topic, history = _message_record(3, "report-again/0", record)
    reads.committed.append(topic)
    reads.history.append(history)


def _last_state(o: Observations, **changes: object) -> None:
    states = _reads(o).states
    state = states[-1].state
    assert state is not None
    states[-1] = replace(states[-1], state=replace(state, **changes))  # type: ignore[arg-type]


TOPIC_BREAKAGES: dict[str, tuple[Breakage, str | None]] = {
    "a replayed batch wrote an event again": (lambda o: _replayed(o, 1), "duplicated"),
    "a replayed post was rejected under the accepted message's envelope id": (
        _rejected_under_the_accepted_id, "duplicated"),
    "a replayed batch wrote a dispatch again": (lambda o: _replayed(o, 5), "duplicated"),
    "a replayed batch wrote a message record again": (lambda o: _replayed(o, 10), "duplicated"),
    "a dead letter written twice": (lambda o: _reads(o).committed.extend([
        TopicRecord("dead-letter", 0, i, (("commands", 0, 9, "DecodeError"),)) for i in (0, 1)]),
        "duplicated"),
    "an aborted decision no committed transaction repeats": (_aborted_without_twin, "lost"),
    "the answer stored at a second seq": (_history_twice, "duplicated"),
    "the user message's run never recorded as completed": (
        lambda o: (_reads(o).history.pop(), _reads(o).committed.pop()), "lost"),
    "a gap in the history": (
        lambda o: _reads(o).history.append(HistoryRecord(THREAD, 3, 0, 9, MessageRecord(
            3, StoredMessage("stray", "user", "?", "run-x", 9), RunStatus.DISPATCHED))), "gaps"),
    "the answer not right after its message": (
        lambda o: _reads(o).history.__setitem__(1, replace(_reads(o).history[1], seq=2)), "gaps"),
    "a thread's state went back": (
        lambda o: _reads(o).states.append(replace(_reads(o).states[0], offset=3)), "duplicated"),
    "the newest state disagrees with the history": (
        lambda o: _last_state(o, message_count=3), None),
}


def test_a_clean_run_passes_the_topic_audit() -> None:
    """A clean run's topics pass the audit, with no aborted records."""
    obs = _with_topics()
    report = audit(obs)
    assert report.ok, report.violations
    assert report.aborted == 0


@pytest.mark.parametrize("name", sorted(TOPIC_BREAKAGES))
def test_the_topic_audit_catches(name: str) -> None:
    """The topic audit flags each kind of deliberate breakage of the topics."""
    breakage, counter = TOPIC_BREAKAGES[name]
    obs = _with_topics()  # fresh each time (states hold mapping proxies: no deepcopy)
    breakage(obs)
    report = audit(obs)
    assert not report.ok, name
    if counter is not None:
        assert getattr(report, counter) >= 1, (name, counter, report.violations)


def test_an_aborted_copy_hidden_from_read_committed_is_counted_not_failed() -> None:
    """Exactly once under a kill mid-transaction: the read_uncommitted read has the
    aborted batch and its retry, the committed read the retry alone."""
    obs = _with_topics()
    reads = _reads(obs)
    reads.uncommitted = list(reads.committed)
    first = reads.committed[1]
    reads.uncommitted.append(replace(first, offset=first.offset + 100))
    report = audit(obs)  # past the last committed record: perhaps still open
    assert report.ok, report.violations
    assert report.aborted == 0
    _committed_later(reads, "events")
    report = audit(obs)
    assert report.ok, report.violations
    assert report.aborted == 1
    # The negative control: the same copy visible to read_committed is a duplicate.
    reads.committed.append(replace(first, offset=first.offset + 100))
    assert audit(obs).duplicated >= 1


def test_a_resent_post_rejected_again_under_its_own_envelope_id_is_not_a_duplicate() -> None:
    """A resent post rejected again under its own envelope id is not a duplicate decision."""
    obs = _with_topics()
    rejected = RunRejected(THREAD, MESSAGE, RejectReason.DUPLICATE, "message id already has a run",
                           RUN, 1)
    _reads(obs).committed.append(_event_record(60, "resend/0", rejected))
    _reads(obs).committed.append(_event_record(61, "resend-again/0", rejected))
    assert not [v for v in audit(obs).violations if "identity" in v]


# --- double-texting (multitask_strategy) ------------------------------------------------

RUN2, MESSAGE2, ANSWER2 = "run-2", "msg-2", "second answer"


def _plain(run: str, *events: str, text: str | None = None) -> list[Seen]:
    """A reference replay of `run`: the lifecycle events named, then done."""
    seen = []
    for offset, event in enumerate(events):
        fields: dict[str, object] = {"thread_id": THREAD, "run_id": run}
        if event == "run_completed":
            fields["message"] = {"message_id": f"{run}-answer", "text": text}
        seen.append(Seen(f"{run}-{offset}", event, json.dumps(fields)))
    return [*seen, Seen(f"{run}-done", "done", "[DONE]")]


def _double_text(strategy: str, reason: str | None = None) -> Observations:
    """msg-1's run, then msg-2 posted with `strategy` while it runs."""
    first = Post(THREAD, MESSAGE, RUN, accepted=True, statuses=[202])
    second = Post(THREAD, MESSAGE2, RUN2, accepted=True, statuses=[202], strategy=strategy,
                  interrupts=RUN if strategy == "interrupt" else None)
    ends_first: Event = RunCancelled(THREAD, RUN, reason, 3) if reason else \
        RunCompleted(THREAD, RUN, 1, AssistantMessage("a1", ANSWER), 3)
    events: list[Event] = [
        MessageAccepted(THREAD, MESSAGE, "hi", "m-0", 1), RunAccepted(THREAD, RUN, "wf", MESSAGE, 1),
        AttemptDispatched(THREAD, RUN, MESSAGE, 1, 1),
        MessageAccepted(THREAD, MESSAGE2, "again", "m-1", 2)]
    if strategy == "enqueue":
        events.append(MessageQueued(THREAD, MESSAGE2, 0, 2))
    events += [ends_first, RunAccepted(THREAD, RUN2, "wf", MESSAGE2, 3),
               AttemptDispatched(THREAD, RUN2, MESSAGE2, 1, 3),
               RunCompleted(THREAD, RUN2, 1, AssistantMessage("a2", ANSWER2), 4)]
    user1: dict[str, object] = {"message_id": MESSAGE, "role": "user", "text": "hi", "run_id": RUN}
    answer1: dict[str, object] = {"message_id": "a1", "role": "assistant", "text": ANSWER, "run_id": RUN}
    user2: dict[str, object] = {"message_id": MESSAGE2, "role": "user", "text": "again", "run_id": RUN2}
    answer2: dict[str, object] = {"message_id": "a2", "role": "assistant", "text": ANSWER2, "run_id": RUN2}
    stored: list[dict[str, object]] = {
        "enqueue": [user1, user2, answer1, answer2], "interrupt": [user1, user2, answer2],
        "rollback": [user2, answer2]}[strategy]
    first_ref = _plain(RUN, "run_accepted", "run_cancelled") if reason else \
        _plain(RUN, "run_accepted", "run_completed", text=ANSWER)
    return Observations(posts=[first, second], events=events, stored={THREAD: stored},
                        references={RUN: first_ref,
                                    RUN2: _plain(RUN2, "run_accepted", "run_completed",
                                                 text=ANSWER2)},
                        watchers=[])


@pytest.mark.parametrize(("strategy", "reason", "counter"), [
    ("enqueue", None, "enqueued"), ("interrupt", CancelReason.INTERRUPTED, "interrupted"),
    ("rollback", CancelReason.ROLLED_BACK, "rolled_back")])
def test_double_texts_pass_and_are_counted(strategy: str, reason: str | None,
                                           counter: str) -> None:
    """An enqueued message answered after the run before it, an interrupted run (its
    question kept, unanswered) and a rolled-back one (answered-then-removed) pass."""
    report = audit(_double_text(strategy, reason))
    assert report.ok, report.violations
    assert getattr(report, counter) == 1 and report.lost == 0


def _swap_runs(o: Observations) -> None:
    o.events[4:6] = [o.events[5], o.events[4]]  # msg-2's run starts before msg-1's ends


DOUBLE_TEXT_BREAKAGES: dict[str, tuple[str, str | None, Breakage, str]] = {
    "a run started while another was active": ("interrupt", CancelReason.INTERRUPTED, _swap_runs,
                                               "duplicated"),
    "an interrupt nobody asked for": (
        "interrupt", CancelReason.INTERRUPTED, lambda o: setattr(o.posts[1], "interrupts", None),
        "violations"),
    "an interrupted run with a stored answer": (
        "interrupt", CancelReason.INTERRUPTED, lambda o: o.stored[THREAD].append(
            {"message_id": "a1", "role": "assistant", "text": "x", "run_id": RUN}), "duplicated"),
    "a rolled-back message still stored": (
        "rollback", CancelReason.ROLLED_BACK, lambda o: o.stored[THREAD].insert(
            0, {"message_id": MESSAGE, "role": "user", "text": "hi", "run_id": RUN}),
        "violations"),
    "queued messages answered out of order": (
        "enqueue", None, lambda o: o.posts.reverse(), "gaps"),
    "an enqueued message never answered": (
        "enqueue", None, lambda o: o.events.pop(), "lost"),
}


@pytest.mark.parametrize("name", sorted(DOUBLE_TEXT_BREAKAGES))
def test_the_audit_catches_double_text_breakage(name: str) -> None:
    """Each broken double-text is flagged (under its counter, where it has one)."""
    strategy, reason, breakage, counter = DOUBLE_TEXT_BREAKAGES[name]
    obs = _double_text(strategy, reason)
    breakage(obs)
    report = audit(obs)
    assert not report.ok, name
    value = getattr(report, counter)
    assert (len(value) if isinstance(value, list) else value) >= 1, (name, report.violations)


def test_two_runs_of_one_message_are_audited_apart() -> None:
    """Accepted posts are told apart by message and run (issue #30: two regenerates of
    one message are two runs): a second run of the message that never ended is lost,
    not hidden behind the first one's clean answer."""
    obs = _clean()
    obs.posts.insert(0, Post(THREAD, MESSAGE, "run-regenerate", accepted=True, statuses=[202]))
    report = audit(obs)
    assert report.accepted == 2
    assert report.lost >= 1 and any("run-regenerate" in v for v in report.violations), \
        report.violations
