"""The chaos audit catches what it claims to: each check fails on data that breaks it."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable

import pytest

from chaos.audit import Observations, Post, Seen, WatchLog, audit, final_text
from chaos.load import run_of
from streams.domain import (
    AssistantMessage,
    AttemptDispatched,
    MessageAccepted,
    RunAccepted,
    RunCompleted,
    RunFailed,
)

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
    events = [
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
    report = audit(_clean())
    assert report.ok, report.violations
    assert (report.accepted, report.answered, report.conflicts, report.watched_runs) == (1, 1, 1, 2)
    assert final_text(_reference()) == (ANSWER, True)


def _watcher(obs: Observations) -> list[Seen]:
    return obs.watchers[0].runs[RUN]


Breakage = Callable[[Observations], None]

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
    breakage, counter = BREAKAGES[name]
    obs = copy.deepcopy(_clean())
    breakage(obs)
    report = audit(obs)
    assert not report.ok, name
    assert getattr(report, counter) >= 1, (name, counter, report.violations)


def test_dead_letters_and_server_errors_are_violations() -> None:
    obs = _clean()
    obs.dead_letters = 1
    obs.server_errors.append("POST /v1/threads: 500")
    assert len(audit(obs).violations) == 2


def test_a_watcher_told_not_streaming_is_complete_if_the_answer_is_stored() -> None:
    obs = _clean()
    obs.watchers[0].runs[RUN] = obs.watchers[0].runs[RUN][:5]  # then message_not_streaming
    obs.watchers[0].not_streaming.add(RUN)
    assert audit(obs).ok
    obs.stored[THREAD].pop()
    assert audit(obs).lost >= 1


def test_a_run_the_thread_watcher_could_not_follow_is_not_a_gap_unless_it_saw_part_of_it() -> None:
    obs = _clean()
    obs.watchers[0].runs.clear()
    obs.watchers[0].unwatched.add(RUN)
    assert audit(obs).ok
    obs.watchers[0].runs[RUN] = _reference()[:4]
    assert audit(obs).gaps >= 1


def test_a_pending_post_that_was_never_decided_is_lost() -> None:
    obs = _clean()
    obs.posts.append(Post(THREAD, "msg-2", "run-2", accepted=True, statuses=[202]))
    report = audit(obs)
    assert report.lost >= 1 and report.accepted == 2


def test_the_run_of_a_done_event_is_read_from_its_id() -> None:
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
