"""Regenerate, edit and switch branch through the processor and Kafka (issue #30,
docs/branches.md): what the processor looks up (`Known`), the records it writes with
their parents, and the context it dispatches (the branch's path). The test plays the
worker: it reports each answer itself."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Message, Producer

from streams.config import Settings
from streams.core.domain import (
    AttemptDispatched,
    BranchSwitched,
    Command,
    CreateThread,
    EditMessage,
    Event,
    MessageAccepted,
    MessageQueued,
    MultitaskStrategy,
    PostUserMessage,
    RegenerateAccepted,
    RegenerateAnswer,
    RejectReason,
    ReportAttemptCompleted,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunRejected,
    RunStatus,
    SwitchBranch,
)
from streams.core.ids import regenerate_run_id_for, run_id_for
from streams.core.reasons import CancelReason
from streams.core.records import Dispatch, MessageRecord, TextDelta
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess
from streams.wire import Codec
from tests.kafka_helpers import (
    command_producer,
    flush_all,
    keys_to_end,
    marked,
    read_messages,
    read_topic,
    send_command,
    send_marker,
)

CODEC = Codec()
DAY_MS = 24 * 60 * 60 * 1000

pytestmark = pytest.mark.kafka


def _now() -> int:
    return int(time.time() * 1000)


class Thread:
    """One thread of a test: commands out, its events, dispatches and history in."""

    def __init__(self, settings: Settings, producer: Producer, thread_id: str | None = None) -> None:
        """A new thread, created now; with `thread_id`, that thread, not created here."""
        self.settings, self.producer = settings, producer
        self.id = thread_id or f"th-{uuid.uuid4()}"
        if thread_id is None:
            self.send(CreateThread(self.id, "t", "branches", _now()))

    def send(self, command: Command) -> None:
        """Send `command` and wait until the broker has it."""
        send_command(self.producer, self.settings, command)
        flush_all(self.producer)

    def post(self, message_id: str, text: str,
             strategy: MultitaskStrategy = MultitaskStrategy.REJECT) -> None:
        """Post user message `message_id`."""
        self.send(PostUserMessage(self.id, "t", message_id, text, None, _now(), strategy))

    def regenerate(self, message_id: str, key: str, now_ms: int | None = None,
                   strategy: MultitaskStrategy = MultitaskStrategy.REJECT) -> None:
        """Regenerate the answer to user message `message_id` with idempotency key `key`."""
        self.send(RegenerateAnswer(self.id, "t", message_id, key, now_ms or _now(), strategy))

    def answer(self, run_id: str, text: str) -> None:
        """The worker's report: run `run_id` (attempt 1) answered `text`."""
        self.send(ReportAttemptCompleted(self.id, run_id, 1, "w1", text, (), (), _now()))

    def events(self, until: Callable[[list[Event]], bool] | None = None) -> list[Event]:
        """The thread's events once `until` holds of them; by default, once a marker
        sent now is decided (so is every command sent before it)."""
        if until is None:
            until = marked(send_marker(self.producer, self.settings, self.id))
        done = until
        found = read_topic(self.settings, self.settings.topics.events,
                           lambda b: CODEC.decode_event(b)[1],
                           until=lambda r: done([e for e in r if e.thread_id == self.id]))
        return [e for e in found if e.thread_id == self.id and not _is_marker(e)]

    def dispatch_of(self, run_id: str) -> Dispatch:
        """The (first) dispatch of `run_id`."""
        found = read_topic(self.settings, self.settings.topics.dispatch, CODEC.decode_dispatch,
                           until=lambda r: any(d.run_id == run_id for _, d in r))
        return next(d for _, d in found if d.run_id == run_id)

    def history(self) -> dict[int, MessageRecord | None]:
        """Each seq's newest record on the messages topic (None: a tombstone), read
        after a marker: every earlier command's records are there."""
        self.events()
        prefix = f"{self.id}/".encode()

        def decode(msg: Message) -> tuple[bytes, MessageRecord | None]:
            value = msg.value()
            return msg.key() or b"", None if value is None else CODEC.decode_message(value)[1]

        count = len(keys_to_end(self.settings, self.settings.topics.messages))
        rows = read_messages(self.settings, self.settings.topics.messages, decode,
                             until=lambda r: len(r) >= count)
        newest: dict[int, MessageRecord | None] = {}
        for key, record in rows:
            if key.startswith(prefix):
                newest[int(key[len(prefix):])] = record
        return newest


def _is_marker(event: Event) -> bool:
    return isinstance(event, RunRejected) and event.message_id.startswith("marker-")


def _of(events: list[Event], kind: type[Event], run_id: str | None = None) -> list[Event]:
    return [e for e in events if isinstance(e, kind)
            and (run_id is None or getattr(e, "run_id", None) == run_id)]


def _texts(dispatch: Dispatch) -> list[str]:
    return [m.text for m in dispatch.history]


@pytest.fixture
def thread(settings: Settings, processor: RoleProcess) -> Thread:
    """A new thread with one answered question: m0 "first" (seq 0), "answer zero" (1)."""
    made = Thread(settings, command_producer(settings))
    made.post("m0", "first")
    made.answer(run_id_for(made.id, "m0"), "answer zero")
    return made


def test_a_regenerate_sent_twice_with_one_key_makes_one_answer(thread: Thread) -> None:
    """The same key again is a duplicate naming the one run, both inside its idempotency
    window (the state) and a day later (the history table's index of its answer)."""
    regen = regenerate_run_id_for(thread.id, "k1")
    thread.regenerate("m0", "k1")
    dispatch = thread.dispatch_of(regen)
    assert (dispatch.message_id, dispatch.input_text, _texts(dispatch)) == ("m0", "first", [])
    thread.answer(regen, "answer zero, again")
    thread.regenerate("m0", "k1")
    thread.regenerate("m0", "k1", now_ms=_now() + 2 * DAY_MS)  # past the key's window

    events = thread.events()
    assert len(_of(events, RunAccepted, regen)) == 1
    assert len(_of(events, RegenerateAccepted)) == 1
    repeats = [e for e in events if isinstance(e, RunRejected)]
    assert [(e.reason, e.existing_run_id) for e in repeats] == [(RejectReason.DUPLICATE, regen)] * 2
    history = thread.history()
    answers = {s: r for s, r in history.items() if r is not None and r.message.run_id == regen}
    assert list(answers) == [2] and answers[2].parent_seq == 0  # a new branch from m0
    assert answers[2].message.text == "answer zero, again"
    assert history[1] is not None and history[1].message.text == "answer zero"  # kept


def test_an_edit_forks_the_thread_and_a_switch_goes_back(thread: Thread) -> None:
    """An edit stores a sibling of the edited message and answers it on the new branch
    (the current one); the old branch is kept, and a switch back continues it."""
    thread.post("m1", "second")
    thread.answer(run_id_for(thread.id, "m1"), "answer one")  # seqs 2, 3
    thread.send(EditMessage(thread.id, "t", "m1", "m1-edited", "second, edited", None, _now()))
    edited_run = run_id_for(thread.id, "m1-edited")
    dispatch = thread.dispatch_of(edited_run)
    assert (dispatch.input_text, _texts(dispatch)) == ("second, edited", ["first", "answer zero"])
    thread.answer(edited_run, "answer one, edited")  # seq 5

    events = thread.events()
    accepted = [e for e in events if isinstance(e, MessageAccepted) and e.message_id == "m1-edited"]
    assert len(accepted) == 1 and accepted[0].parent_seq == 1
    assert [e.seq for e in events if isinstance(e, BranchSwitched)] == [4]
    history = thread.history()
    assert history[4] is not None and history[4].parent_seq == 1  # beside m1, not after it
    assert history[5] is not None and history[5].parent_seq is None  # follows the edit
    assert [history[s].message.text for s in (2, 3)] == ["second", "answer one"]  # type: ignore[union-attr]

    thread.send(SwitchBranch(thread.id, "t", 3, _now()))  # back to the first branch
    thread.post("m2", "third")
    dispatch = thread.dispatch_of(run_id_for(thread.id, "m2"))
    assert _texts(dispatch) == ["first", "answer zero", "second", "answer one"]
    events = thread.events()
    assert [e.seq for e in events if isinstance(e, BranchSwitched)] == [4, 3]
    history = thread.history()
    assert history[6] is not None and history[6].parent_seq == 3
    assert history[6].message.message_id == "m2"


def test_a_regenerate_answers_from_the_path_above_its_message_on_a_branched_thread(
        thread: Thread) -> None:
    """The context of a regenerate deep in a branched thread is the path from its message
    to the root, not the newest messages."""
    thread.post("m1", "second")
    thread.answer(run_id_for(thread.id, "m1"), "answer one")  # 2, 3
    thread.send(EditMessage(thread.id, "t", "m0", "m0-edited", "first, edited", None, _now()))
    thread.answer(run_id_for(thread.id, "m0-edited"), "answer zero, edited")  # 4 (root), 5
    regen = regenerate_run_id_for(thread.id, "k-deep")
    thread.regenerate("m1", "k-deep")  # m1 is on the first branch: its path is 1, 0
    dispatch = thread.dispatch_of(regen)
    assert (dispatch.input_text, _texts(dispatch)) == ("second", ["first", "answer zero"])
    thread.answer(regen, "answer one, again")
    history = thread.history()
    assert history[4] is not None and history[4].parent_seq == -1  # an edit of a root: a root
    assert history[6] is not None and history[6].parent_seq == 2
    assert [e.seq for e in thread.events() if isinstance(e, BranchSwitched)] == [4, 2]


def test_a_rolled_back_message_off_the_newest_line_has_its_children_relinked(
        thread: Thread) -> None:
    """A message whose parent is not the one before it (posted after a switch back) is
    rolled back while a message queued behind it waits: that message's record is
    rewritten with the removed one's parent, so its branch's path (and the context) still
    runs through the branch it was posted on, not the newest line."""
    thread.post("m1", "second")
    thread.answer(run_id_for(thread.id, "m1"), "answer one")  # 2, 3
    thread.send(EditMessage(thread.id, "t", "m1", "m1-edited", "second, edited", None, _now()))
    thread.answer(run_id_for(thread.id, "m1-edited"), "answer one, edited")  # 4, 5
    thread.send(SwitchBranch(thread.id, "t", 3, _now()))
    thread.post("m2", "third")  # 6, parent 3: its run active
    thread.post("m3", "fourth", MultitaskStrategy.ENQUEUE)  # 7, after m2
    thread.post("m4", "fifth", MultitaskStrategy.ROLLBACK)  # m2 rolled back; 8
    dispatch = thread.dispatch_of(run_id_for(thread.id, "m4"))
    assert _texts(dispatch) == ["first", "answer zero", "second", "answer one"]
    history = thread.history()
    assert history[6] is None
    assert history[7] is not None and history[7].message.message_id == "m3"
    assert history[7].parent_seq == 3  # was None (after m2): relinked to m2's parent
    assert history[8] is not None and history[8].parent_seq is None


@pytest.mark.parametrize("strategy", list(MultitaskStrategy))
def test_a_regenerate_while_a_run_is_active_follows_the_strategy(
        thread: Thread, strategy: MultitaskStrategy) -> None:
    """docs/branches.md, "While a run is active": m1's run is active when m0's answer is
    regenerated."""
    thread.post("m1", "second")  # seq 2, its run active
    active = run_id_for(thread.id, "m1")
    regen = regenerate_run_id_for(thread.id, "k2")
    thread.regenerate("m0", "k2", strategy=strategy)
    events = thread.events()
    if strategy is MultitaskStrategy.REJECT:
        rejected = _of(events, RunRejected)
        assert [(e.reason, e.existing_run_id) for e in rejected if isinstance(e, RunRejected)] \
            == [(RejectReason.CONFLICT, active)]
        assert not _of(events, RegenerateAccepted)
        return
    if strategy is MultitaskStrategy.ENQUEUE:
        queued = _of(events, MessageQueued)
        assert len(queued) == 1 and isinstance(queued[0], MessageQueued)
        assert (queued[0].seq, queued[0].run_id, queued[0].branch) == (0, regen, True)
        assert not _of(events, RunAccepted, regen)
        thread.answer(active, "answer one")  # stored on m1's branch, then the fork runs
    dispatch = thread.dispatch_of(regen)
    assert (dispatch.input_text, _texts(dispatch)) == ("first", [])
    thread.answer(regen, "answer zero, again")
    events = thread.events()
    cancelled = [e for e in events if isinstance(e, RunCancelled)]
    reason = {MultitaskStrategy.INTERRUPT: CancelReason.INTERRUPTED,
              MultitaskStrategy.ROLLBACK: CancelReason.ROLLED_BACK}.get(strategy)
    assert [(e.run_id, e.reason) for e in cancelled] == ([(active, reason)] if reason else [])
    assert len(_of(events, RunAccepted, regen)) == 1 and len(_of(events, RunCompleted, regen)) == 1
    assert [e.seq for e in events if isinstance(e, BranchSwitched)] == [0]
    history = thread.history()
    m1 = history.get(2)
    if strategy is MultitaskStrategy.ROLLBACK:
        assert m1 is None  # tombstoned
    else:
        assert m1 is not None and m1.run_status is (
            RunStatus.COMPLETED if strategy is MultitaskStrategy.ENQUEUE else RunStatus.CANCELLED)
    answers = [r for r in history.values() if r is not None and r.message.run_id == regen]
    assert len(answers) == 1 and answers[0].parent_seq == 0
    if strategy is MultitaskStrategy.ENQUEUE:
        mine = history[3]  # the active run's answer stayed on its own branch, after m1
        assert mine is not None and mine.message.text == "answer one" and mine.parent_seq is None


def test_an_edit_enqueued_behind_a_run_is_stored_at_once_and_runs_on_its_branch(
        thread: Thread) -> None:
    """An edit under enqueue stores its message now, off the current branch; the active
    run's answer still goes to its own branch; then the edit's branch becomes current
    and its run gets that branch's path (a root: none) and its text from the store."""
    thread.post("m1", "second")  # 2, its run active
    thread.send(EditMessage(thread.id, "t", "m0", "m0-edited", "first, edited", None, _now(),
                            MultitaskStrategy.ENQUEUE))  # 3, a root
    edited_run = run_id_for(thread.id, "m0-edited")
    events = thread.events()
    queued = _of(events, MessageQueued)
    assert len(queued) == 1 and isinstance(queued[0], MessageQueued) and queued[0].branch
    assert not _of(events, RunAccepted, edited_run)
    thread.answer(run_id_for(thread.id, "m1"), "answer one")  # 4, after m1
    dispatch = thread.dispatch_of(edited_run)
    assert (dispatch.input_text, _texts(dispatch)) == ("first, edited", [])
    thread.answer(edited_run, "answer zero, edited")  # 5, after the edit (not after 4)
    assert [e.seq for e in thread.events() if isinstance(e, BranchSwitched)] == [3]
    history = thread.history()
    assert history[3] is not None and history[3].parent_seq == -1
    assert history[4] is not None and history[4].parent_seq == 2
    assert history[5] is not None and history[5].parent_seq == 3


def test_a_regenerate_rolled_back_keeps_its_message_in_the_context(thread: Thread) -> None:
    """A regenerate's run rolled back by a later post removes no message: its question
    (an earlier run's) stays stored and in the new run's context."""
    regen = regenerate_run_id_for(thread.id, "k3")
    thread.regenerate("m0", "k3")  # switches to m0 (seq 0); its run is active
    thread.dispatch_of(regen)
    thread.post("m1", "second", MultitaskStrategy.ROLLBACK)
    dispatch = thread.dispatch_of(run_id_for(thread.id, "m1"))
    assert _texts(dispatch) == ["first"]
    events = thread.events()
    assert [(e.run_id, e.reason) for e in events if isinstance(e, RunCancelled)] == \
        [(regen, CancelReason.ROLLED_BACK)]
    history = thread.history()
    assert history[0] is not None and history[0].message.message_id == "m0"
    assert history[2] is not None and history[2].parent_seq == 0  # m1 follows m0 there
    assert not any(isinstance(e, AttemptDispatched) and e.run_id == regen and e.attempt > 1
                   for e in events)


# --- with a real worker, killed between the two sends -----------------------------

_KILL_ENV = {  # short liveness, a slow agent (the kill lands mid-run), as tests/streams/worker
    "THREADLINE_HEARTBEAT_INTERVAL_S": "0.5", "THREADLINE_HEARTBEAT_TIMEOUT_S": "20",
    "THREADLINE_RETRY_INITIAL_S": "0.2", "THREADLINE_SESSION_TIMEOUT_S": "6",
    "THREADLINE_AGENT_TOKENS_PER_S": "200", "THREADLINE_AGENT_SLOW_TOKENS_PER_S": "10",
    "THREADLINE_AGENT_WORDS": "30", "THREADLINE_AGENT_STEPS": "1",
}


def _worker(env: dict[str, str], tmp: Path, name: str) -> RoleProcess:
    return RoleProcess("worker", {**env, "THREADLINE_DATA_DIR": str(tmp / name),
                                  "THREADLINE_INSTANCE_ID": name}, tmp / f"{name}.log").start()


@pytest.mark.chaos
def test_a_regenerate_sent_twice_with_the_worker_killed_between_makes_one_answer(
        test_env: dict[str, str], tmp_path: Path) -> None:
    """kill -9 the worker running a regenerate, send the regenerate again with its key,
    start another worker: one run, one answer. Then kill -9 the processor and start one
    with an empty data folder (its tables restored from the topics alone): the key sent
    a day later is still a duplicate (the index of the regenerate's answer)."""
    from streams.testing.stack import wait_for_group

    env = {**test_env, **_KILL_ENV}
    settings = Settings.from_env(env)
    ensure_topics(settings)
    procs = [RoleProcess("processor", env, tmp_path / "processor.log").start(),
             _worker(env, tmp_path, "w1")]
    try:
        wait_for_group(settings, f"{settings.topic_prefix}worker", 1)
        procs[0].wait_for_log("assigned [", 120)
        thread = Thread(settings, command_producer(settings))
        thread.post("m0", "[slow] tell me about rivers")
        thread.events(lambda e: bool(_of(e, RunCompleted, run_id_for(thread.id, "m0"))))

        regen = regenerate_run_id_for(thread.id, "k-kill")
        thread.regenerate("m0", "k-kill")
        found = read_topic(settings, settings.topics.stream, CODEC.decode_stream,
                           until=lambda r: any(o.run_id == regen and isinstance(o.payload, TextDelta)
                                               for _, o in r))
        assert found  # the worker is streaming the regenerate's answer
        procs[1].kill9()
        thread.regenerate("m0", "k-kill")
        procs.append(_worker(env, tmp_path, "w2"))
        thread.events(lambda e: bool(_of(e, RunCompleted, regen)))

        events = thread.events()
        assert len(_of(events, RunAccepted, regen)) == 1, procs[0].tail()
        assert len(_of(events, RunCompleted, regen)) == 1
        assert [(e.reason, e.existing_run_id) for e in events if isinstance(e, RunRejected)] \
            == [(RejectReason.DUPLICATE, regen)]
        answers = [r for r in thread.history().values()
                   if r is not None and r.message.run_id == regen]
        assert len(answers) == 1 and answers[0].parent_seq == 0

        procs[0].kill9()
        procs[0] = RoleProcess("processor", {**env, "THREADLINE_DATA_DIR": str(tmp_path / "p2")},
                               tmp_path / "processor-2.log").start()
        thread.regenerate("m0", "k-kill", now_ms=_now() + 2 * DAY_MS)  # past the key's window
        events = thread.events()
        assert len(_of(events, RunAccepted, regen)) == 1, procs[0].tail()
        assert [(e.reason, e.existing_run_id) for e in events if isinstance(e, RunRejected)] \
            == [(RejectReason.DUPLICATE, regen)] * 2
    finally:
        for proc in procs:
            proc.stop()
