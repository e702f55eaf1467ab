"""The chaos audit of regenerates and edits (issue #30, chaos/branch_audit.py and the
history check of chaos/topic_audit.py): a clean branched thread passes, and each
seeded fault (a regenerate answered twice, its answer on the wrong branch, its key
running twice, an edit not beside the message it replaces) fails it."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from chaos.audit import Observations, Post, Seen, audit
from chaos.topic_audit import HistoryRecord, StateRecord, TopicReads, audit_topics
from streams.core.domain import (
    AssistantMessage,
    Event,
    MessageAccepted,
    RegenerateAccepted,
    RunAccepted,
    RunCompleted,
    RunStatus,
    StoredMessage,
    ThreadState,
)
from streams.core.records import MessageRecord

THREAD = "th-b"
# seq 0 the question (msg-1) and 1 its answer (run-1): the first branch;
# seq 2 a regenerate's answer (run-r), its parent 0: the second branch;
# seq 3 an edit of msg-1 (msg-e, a new root) and 4 its answer (run-e): the current one.
ANSWERS = {"run-1": "first", "run-r": "again", "run-e": "edited", "run-q": "queued"}


def _user(seq: int, message_id: str, run_id: str, parent: int | None) -> MessageRecord:
    return MessageRecord(seq, StoredMessage(message_id, "user", "hi", run_id, seq),
                         RunStatus.COMPLETED, 1, parent)


def _answer(seq: int, run_id: str, parent: int | None) -> MessageRecord:
    return MessageRecord(seq, StoredMessage(f"{run_id}-answer", "assistant", ANSWERS[run_id],
                                            run_id, seq), None, 0, parent)


def _json(record: MessageRecord) -> dict[str, object]:
    """The record as the native API shows it: its parent spelled out."""
    m = record.message
    parent = record.seq - 1 if record.parent_seq is None else record.parent_seq
    return {"seq": record.seq, "message_id": m.message_id, "role": m.role, "text": m.text,
            "run_id": m.run_id, "parent_seq": parent}


def _reference(run: str) -> list[Seen]:
    fields = {"thread_id": THREAD, "run_id": run}
    return [Seen(f"{run}-0", "run_accepted", json.dumps(fields)),
            Seen(f"{run}-1", "run_completed", json.dumps(
                {**fields, "message": {"message_id": f"{run}-answer", "text": ANSWERS[run]}})),
            Seen(f"{run}-done", "done", "[DONE]")]


def _observed(records: list[MessageRecord], events: list[Event],
              paths: dict[int, list[int]], posts: list[Post]) -> Observations:
    """What a chaos run would have collected: the API's branches and the topics alike."""
    runs = sum(isinstance(e, RunAccepted) for e in events)
    state = ThreadState(THREAD, "t", "title", 0, message_count=len(records), run_count=runs)
    topics = TopicReads(events=[(THREAD, e) for e in events],
                        history=[HistoryRecord(THREAD, r.seq, 0, i, r)
                                 for i, r in enumerate(records)],
                        states=[StateRecord(THREAD, 0, 0, state)])
    return Observations(posts=posts, events=events, stored={THREAD: [_json(r) for r in records]},
                        references={run: _reference(run) for run in ANSWERS}, watchers=[],
                        topics=topics, paths={THREAD: paths})


def _clean() -> Observations:
    records = [_user(0, "msg-1", "run-1", None), _answer(1, "run-1", None),
               _answer(2, "run-r", 0), _user(3, "msg-e", "run-e", -1), _answer(4, "run-e", None)]
    events: list[Event] = [
        MessageAccepted(THREAD, "msg-1", "hi", "m-0", 1),
        RunAccepted(THREAD, "run-1", "wf", "msg-1", 1),
        RunCompleted(THREAD, "run-1", 1, AssistantMessage("run-1-answer", "first"), 2),
        RegenerateAccepted(THREAD, "msg-1", 0, "run-r", "r-1", 3),
        RunAccepted(THREAD, "run-r", "wf", "msg-1", 3),
        RunCompleted(THREAD, "run-r", 1, AssistantMessage("run-r-answer", "again"), 4),
        MessageAccepted(THREAD, "msg-e", "hi", "e-2", 5, parent_seq=-1),
        RunAccepted(THREAD, "run-e", "wf", "msg-e", 5),
        RunCompleted(THREAD, "run-e", 1, AssistantMessage("run-e-answer", "edited"), 6),
    ]
    posts = [Post(THREAD, "msg-1", "run-1", accepted=True, statuses=[202]),
             Post(THREAD, "msg-1", "run-r", accepted=True, statuses=[202, 202],
                  kind="regenerate", run_ids=["run-r", "run-r"], key_resent=True),
             Post(THREAD, "msg-e", "run-e", accepted=True, statuses=[202], kind="edit",
                  edits="msg-1", run_ids=["run-e"])]
    return _observed(records, events, {1: [0, 1], 2: [0, 2], 4: [3, 4]}, posts)


def test_a_branched_thread_passes_and_counts() -> None:
    """A regenerate whose answer stands at a later seq linked to its question, its key
    sent twice, and an edit beside the message it replaces: every audit passes, and the
    first answer, now only on an older branch, is not lost."""
    report = audit(_clean())
    assert report.ok, report.violations
    assert (report.accepted, report.answered, report.regenerated, report.edited,
            report.keys_resent, report.lost) == (3, 3, 1, 1, 1, 0)


def _rewrite(o: Observations, seq: int, record: MessageRecord | None,
             paths: dict[int, list[int]] | None = None, *, api: bool = True,
             topics: bool = True) -> None:
    """Put `record` at `seq` (append it if new) in what the API served and/or on the topics."""
    assert o.topics is not None and o.paths is not None
    if topics and record is not None:
        history = [h for h in o.topics.history if h.seq != seq]
        o.topics.history = [*history, HistoryRecord(THREAD, seq, 0, 100 + seq, record)]
    if api and record is not None:
        o.stored[THREAD] = sorted([m for m in o.stored[THREAD] if m["seq"] != seq] + [_json(record)],
                                  key=lambda m: int(str(m["seq"])))
    if paths is not None:
        o.paths[THREAD] = paths


def _answered_twice(o: Observations) -> None:
    _rewrite(o, 5, _answer(5, "run-r", 0), {1: [0, 1], 2: [0, 2], 4: [3, 4], 5: [0, 5]})


def _wrong_branch(o: Observations, *, api: bool = True, topics: bool = True) -> None:
    """The regenerate's answer linked after the first answer (the older branch)."""
    _rewrite(o, 2, _answer(2, "run-r", 1), {1: [0, 1, 2], 4: [3, 4]} if api else None,
             api=api, topics=topics)


def _key_ran_twice(o: Observations) -> None:
    o.posts[1].run_ids = ["run-r", "run-r2"]


def _accepted_twice(o: Observations) -> None:
    o.events.insert(4, RegenerateAccepted(THREAD, "msg-1", 0, "run-r", "r-1", 3))


def _edit_elsewhere(o: Observations) -> None:
    """The edit stored as a child of the first answer, not beside msg-1."""
    _rewrite(o, 3, _user(3, "msg-e", "run-e", 1), {2: [0, 2], 4: [0, 1, 3, 4]})


FAULTS: dict[str, tuple[Callable[[Observations], None], str, str]] = {
    "a regenerate answered twice": (_answered_twice, "duplicated", "run-r"),
    "a regenerate's answer on the wrong branch": (_wrong_branch, "gaps", "off its branch"),
    "the same, seen by the API reads alone": (
        lambda o: _wrong_branch(o, topics=False), "gaps", "no branch reads its question"),
    "the same, seen on the topics alone": (
        lambda o: _wrong_branch(o, api=False), "gaps", "history of th-b: regenerate run-r"),
    "a regenerate's key named two runs": (_key_ran_twice, "duplicated", "one key named runs"),
    "a regenerate accepted twice": (_accepted_twice, "duplicated", "2 RegenerateAccepted"),
    "an edit not beside the message it replaces": (_edit_elsewhere, "gaps", "edit msg-e"),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_the_branch_audit_catches(name: str) -> None:
    """Each seeded fault fails the audit, on the counter and with the words expected."""
    fault, counter, words = FAULTS[name]
    obs = _clean()
    fault(obs)
    report = audit(obs)
    assert getattr(report, counter) >= 1, (name, report.violations)
    assert any(words in v for v in report.violations), (name, report.violations)


def test_the_topic_audit_takes_a_regenerate_for_a_late_post_only_when_told() -> None:
    """Without the regenerates named, the regenerate's answer two seqs after its
    question on another branch is a gap; named, it is the branch the links say."""
    obs = _clean()
    assert obs.topics is not None
    posts = [p for p in obs.posts if p.kind != "edit"]
    plain = audit_topics(obs.topics, posts)
    assert any("answer at 2" in text for _, text in plain.violations), plain.violations
    named = audit_topics(obs.topics, posts, regenerates={("msg-1", "run-r")})
    assert not named.violations, named.violations



def _queued_behind_the_regenerate(strategy: str) -> Observations:
    """msg-1 answered, then regenerated (run-r) while msg-q is posted with `strategy`:
    enqueued, msg-q is stored at once on the regenerate's branch (seq 2, parent 0),
    before the running answer (seq 3, whose parent is then msg-q), and answered last."""
    records = [_user(0, "msg-1", "run-1", None), _answer(1, "run-1", None),
               _user(2, "msg-q", "run-q", 0), _answer(3, "run-r", None),
               _answer(4, "run-q", None)]
    events: list[Event] = [
        MessageAccepted(THREAD, "msg-1", "hi", "m-0", 1),
        RunAccepted(THREAD, "run-1", "wf", "msg-1", 1),
        RunCompleted(THREAD, "run-1", 1, AssistantMessage("run-1-answer", "first"), 2),
        RegenerateAccepted(THREAD, "msg-1", 0, "run-r", "r-1", 3),
        RunAccepted(THREAD, "run-r", "wf", "msg-1", 3),
        MessageAccepted(THREAD, "msg-q", "hi", "m-2", 4),
        RunCompleted(THREAD, "run-r", 1, AssistantMessage("run-r-answer", "again"), 5),
        RunAccepted(THREAD, "run-q", "wf", "msg-q", 5),
        RunCompleted(THREAD, "run-q", 1, AssistantMessage("run-q-answer", "queued"), 6),
    ]
    posts = [Post(THREAD, "msg-1", "run-1", accepted=True, statuses=[202]),
             Post(THREAD, "msg-1", "run-r", accepted=True, statuses=[202], kind="regenerate",
                  run_ids=["run-r"]),
             Post(THREAD, "msg-q", "run-q", accepted=True, statuses=[202], strategy=strategy)]
    return _observed(records, events, {1: [0, 1], 4: [0, 2, 3, 4]}, posts)


def test_a_message_enqueued_behind_a_regenerate_may_stand_before_its_answer() -> None:
    """Found by make chaos (seed 3001): a post enqueued behind a regenerate's run is
    stored before that run's answer, on its branch, as behind any run. Enqueued, it
    passes; the same records with the message not enqueued are off the branch."""
    report = audit(_queued_behind_the_regenerate("enqueue"))
    assert report.ok, report.violations
    report = audit(_queued_behind_the_regenerate("reject"))
    assert report.gaps >= 1
    assert any("run-r" in v and "off its branch" in v for v in report.violations), \
        report.violations
