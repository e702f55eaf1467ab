"""A thread's history as a tree (`streams.core.branches`, `streams.core.forks`): random
sequences of posts, answers, regenerates, edits and switches, decided by the pure core
with a model of the processor's history table, against the properties of issue #30.

The model (`Shell`) keeps the stored records as `history_writes` says, and answers
`Known` from them as the processor's history table does: the run of a message id, and
the seq and parent of the user message a regenerate or edit names.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field, replace
from typing import Any

import fastavro
import hypothesis
import pytest
from hypothesis import strategies as st

from streams.core import branches, forks, history, thread
from streams.core.branches import (
    ROOT,
    branch_count,
    branch_path,
    head_of,
    parent_seq_of,
    queued_forks,
    run_context_seqs,
)
from streams.core.domain import (
    AttemptDispatched,
    BranchSwitched,
    Command,
    CreateThread,
    DeleteThread,
    EditMessage,
    Event,
    Known,
    MultitaskStrategy,
    Policy,
    PostUserMessage,
    RegenerateAccepted,
    RegenerateAnswer,
    RejectReason,
    ReportAttemptCompleted,
    ReportAttemptFailed,
    RunAccepted,
    RunRejected,
    StoredMessage,
    SwitchBranch,
    ThreadState,
)
from streams.core.history import (
    HistoryErased,
    MessagePut,
    MessageRemoved,
    RunStatusChanged,
    history_writes,
    relinked,
)
from streams.core.ids import regenerate_run_id_for, run_id_for
from streams.core.records import MessageRecord
from streams.core.thread import decide, evolve
from streams.wire import Codec, EnvelopeMeta, schema_fingerprint
from streams.wire.frame import SINGLE_OBJECT_MARKER
from streams.wire.schemas import HISTORY_DIR

T, TENANT = "t-1", "acme"
POLICY = Policy(max_branches=4, max_queued_messages=3)
STRATEGIES = list(MultitaskStrategy)
REJECT, ENQUEUE, INTERRUPT, ROLLBACK = STRATEGIES


# --- the model of the processor's history table -------------------------------------


@dataclass
class Shell:
    """The pure core plus the stored records it writes, as the processor keeps them."""

    policy: Policy = POLICY
    state: ThreadState | None = None
    records: dict[int, MessageRecord] = field(default_factory=dict)
    accepted_runs: list[str] = field(default_factory=list)  # every RunAccepted, in order
    run_message_seq: dict[str, int] = field(default_factory=dict)  # run -> its user message
    decided: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.send(CreateThread(T, TENANT, "Branches", 0))

    def user_seq(self, message_id: str) -> int | None:
        """The seq of the stored user message `message_id` (the processor's index)."""
        return next((seq for seq, r in self.records.items()
                     if r.message.role == "user" and r.message.message_id == message_id), None)

    def known(self, command: Command) -> Known:
        """What the processor's history lookup answers for `command`."""
        match command:
            case PostUserMessage():
                seen = self.user_seq(command.message_id) is not None
                return Known(run_id_for(T, command.message_id) if seen else None)
            case RegenerateAnswer() | EditMessage():
                if isinstance(command, EditMessage):
                    ran = self.user_seq(command.new_message_id) is not None
                    run = run_id_for(T, command.new_message_id) if ran else None
                else:
                    regen = regenerate_run_id_for(T, command.idempotency_key)
                    run = regen if any(r.message.run_id == regen for r in self.records.values()) \
                        else None
                seq = self.user_seq(command.message_id)
                if seq is None:
                    return Known(run)
                return Known(run, target_seq=seq, target_parent_seq=parent_seq_of(self.records[seq]))
            case _:
                return Known()

    def send(self, command: Command) -> list[Event]:
        """Decide `command`, store what it writes, and fold its events in."""
        events = decide(self.state, command, self.policy, self.known(command))
        for event in events:
            for write in history_writes(self.state, event):
                self._store(write)
            self.state = evolve(self.state, event, self.policy)
            if isinstance(event, RunAccepted):
                self.accepted_runs.append(event.run_id)
                assert self.state is not None and self.state.active_run is not None
                self.run_message_seq[event.run_id] = self.state.active_run.message_seq
        self.decided.extend(events)
        return events

    def _store(self, write: object) -> None:
        match write:
            case MessagePut():
                assert write.seq not in self.records, "a seq is written once"
                self.records[write.seq] = MessageRecord(write.seq, write.message, write.run_status,
                                                        write.run_attempts, write.parent_seq)
            case RunStatusChanged():
                if write.seq in self.records:
                    self.records[write.seq] = replace(self.records[write.seq],
                                                      run_status=write.run_status)
            case MessageRemoved():
                self.records.pop(write.seq, None)
                for seq, record in list(self.records.items()):
                    self.records[seq] = relinked(record, write) or record
            case HistoryErased():
                for seq in range(write.message_count):
                    self.records.pop(seq, None)

    def path(self, seq: int) -> list[int]:
        """The stored path from `seq` to its root, newest first."""
        return list(branch_path(seq, self.records.get))

    def complete(self) -> list[Event]:
        """The active run's worker reports its answer."""
        run = self.state.active_run if self.state else None
        if run is None:
            return []
        return self.send(ReportAttemptCompleted(T, run.run_id, run.attempt, "w", f"answer {run.run_id}",
                                                (), (), 10))


# --- operations -------------------------------------------------------------------

Op = tuple[str, int, int, MultitaskStrategy]
OPS = st.tuples(
    st.sampled_from(["post", "complete", "complete", "fail", "regenerate", "edit", "switch",
                     "partial"]),
    st.integers(0, 5), st.integers(0, 3), st.sampled_from(STRATEGIES),
)


def run_op(shell: Shell, op: Op, step: int) -> list[Event]:
    """Send the command `op` draws, at time `step`; what it decided."""
    kind, a, b, strategy = op
    state = shell.state
    assert state is not None
    users = [r.message.message_id for _, r in sorted(shell.records.items()) if r.message.role == "user"]
    target = users[a % len(users)] if users else "nothing"
    match kind:
        case "post":
            return shell.send(PostUserMessage(T, TENANT, f"m{step}", f"text {step}", None, step,
                                              strategy))
        case "complete":
            return shell.complete()
        case "fail":
            run = state.active_run
            return [] if run is None else shell.send(
                ReportAttemptFailed(T, run.run_id, run.attempt, "w", "boom", False, step))
        case "regenerate":
            return shell.send(RegenerateAnswer(T, TENANT, target, f"key{b}", step, strategy))
        case "edit":
            return shell.send(EditMessage(T, TENANT, target, f"e{step}", f"edited {step}", None,
                                          step, strategy))
        case "switch":
            heads = [*state.tip_seqs, head_of(state)]
            return shell.send(SwitchBranch(T, TENANT, heads[a % len(heads)], step))
        case "partial":
            gone = state.interrupted
            return [] if gone is None else shell.send(ReportAttemptCompleted(
                T, gone.run_id, gone.attempts, "w", "partial", (), (), step))
    raise AssertionError(kind)


def check_invariants(shell: Shell) -> None:
    """What must hold after every command, whatever came before."""
    state = shell.state
    assert state is not None
    head = head_of(state)
    # The state stays bounded, and names each branch once.
    assert branch_count(state) + queued_forks(state) <= shell.policy.max_branches
    assert len(set(state.tip_seqs)) == len(state.tip_seqs) and head not in state.tip_seqs
    assert all(0 <= t < state.message_count for t in state.tip_seqs)
    assert ROOT <= head < state.message_count
    # Parent links point back in time, so every path ends at a root.
    for record in shell.records.values():
        assert parent_seq_of(record) < record.seq
    # A branch never copies: each message is stored once.
    ids = [r.message.message_id for r in shell.records.values()]
    assert len(ids) == len(set(ids))
    # No run ever starts twice: a message id, a regenerate key, each runs at most once.
    assert len(shell.accepted_runs) == len(set(shell.accepted_runs))
    # Every answer stands on the branch of the question its run answered.
    for record in shell.records.values():
        if record.message.role == "assistant" and record.run_status is None:
            question = shell.run_message_seq[record.message.run_id]
            assert question in shell.path(record.seq), (record, shell.path(record.seq))
    # The active run answers on the current branch.
    run = state.active_run
    if run is not None and run.message_seq in shell.records:
        assert run.message_seq in shell.path(head)
    # No branch is lost: every stored message is on the path of a head or a tip; and
    # no branch holds two answers to one question (a regenerate's is on its own).
    paths = [shell.path(seq) for seq in (head, *state.tip_seqs)]
    assert set(shell.records) == {seq for path in paths for seq in path}
    for path in paths:
        questions = [shell.run_message_seq[shell.records[seq].message.run_id] for seq in path
                     if shell.records[seq].message.role == "assistant"
                     and shell.records[seq].run_status is None]
        assert len(questions) == len(set(questions)), (path, questions)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(ops=st.lists(OPS, max_size=40))
# Found by this test: a fork under interrupt left messages queued on the branch it
# left (now refused), and a rolled-back edit's head fell back to the seq before it.
@hypothesis.example(ops=[("post", 0, 0, REJECT), ("post", 0, 0, ENQUEUE),
                         ("regenerate", 0, 0, INTERRUPT), ("complete", 0, 0, REJECT)])
@hypothesis.example(ops=[("post", 0, 0, REJECT), ("edit", 0, 0, INTERRUPT),
                         ("regenerate", 0, 0, ROLLBACK)])
@hypothesis.example(ops=[("post", 0, 0, REJECT), ("complete", 0, 0, REJECT), ("edit", 0, 0, REJECT),
                         ("regenerate", 0, 0, ROLLBACK)])
# ... and a regenerate queued behind its message's own run, which a post then rolled back.
@hypothesis.example(ops=[("post", 0, 0, REJECT), ("regenerate", 0, 0, ENQUEUE),
                         ("post", 0, 0, ROLLBACK), ("complete", 0, 0, REJECT),
                         ("complete", 0, 0, REJECT)])
# ... and a post queued on an edit's branch, rolled back once an answer followed it.
@hypothesis.example(ops=[("post", 0, 0, REJECT), ("edit", 0, 0, ENQUEUE), ("complete", 0, 0, REJECT),
                         ("post", 0, 0, ENQUEUE), ("complete", 0, 0, REJECT),
                         ("post", 0, 0, ROLLBACK)])
def test_random_histories_keep_every_branch_property(ops: list[Op]) -> None:
    """Whatever the order of posts, answers, regenerates, edits, switches and
    strategies: bounded state, acyclic links, no copies, no run twice, every answer on
    its question's branch."""
    shell = Shell()
    for step, op in enumerate(ops, start=1):
        run_op(shell, op, step)
        check_invariants(shell)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(ops=st.lists(OPS, max_size=30), repeats=st.integers(2, 4),
                  strategy=st.sampled_from(STRATEGIES))
def test_a_regenerate_sent_again_with_its_key_answers_once(ops: list[Op], repeats: int,
                                                           strategy: MultitaskStrategy) -> None:
    """The same regenerate sent several times, whatever happened in between and
    whatever the strategy, starts one run; every other send is a duplicate naming it."""
    shell = Shell()
    shell.send(PostUserMessage(T, TENANT, "q", "question", None, 1))
    shell.complete()
    regen = regenerate_run_id_for(T, "once")
    for step, op in enumerate(ops, start=2):
        if step % (len(ops) // repeats + 1) == 0:
            for event in shell.send(RegenerateAnswer(T, TENANT, "q", "once", step, strategy)):
                if isinstance(event, RunRejected) and event.reason is RejectReason.DUPLICATE:
                    assert event.existing_run_id == regen
        run_op(shell, op if op[0] != "regenerate" else ("complete", 0, 0, strategy), 1000 + step)
    assert shell.accepted_runs.count(regen) <= 1


def test_a_regenerate_is_a_duplicate_after_its_key_expired_once_its_answer_is_stored() -> None:
    """Past the key window the state forgets the key; the stored answer of its run
    still makes a repeat a duplicate (the shell's `Known.message_run_id`)."""
    shell = Shell(policy=replace(POLICY, idempotency_window_ms=10))
    shell.send(PostUserMessage(T, TENANT, "q", "question", None, 1))
    shell.complete()
    shell.send(RegenerateAnswer(T, TENANT, "q", "k", 2))
    shell.complete()
    regen = regenerate_run_id_for(T, "k")
    late = shell.send(RegenerateAnswer(T, TENANT, "q", "k", 10_000))
    assert [type(e) for e in late] == [RunRejected]
    assert isinstance(late[0], RunRejected) and late[0].reason is RejectReason.DUPLICATE
    assert late[0].existing_run_id == regen and shell.accepted_runs.count(regen) == 1


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(forks=st.lists(st.tuples(st.booleans(), st.integers(0, 20)), min_size=1, max_size=12),
                  max_branches=st.integers(1, 5))
def test_the_branches_are_bounded_and_the_one_past_the_bound_is_refused(
        forks: list[tuple[bool, int]], max_branches: int) -> None:
    """Regenerates and edits make branches up to Policy.max_branches; one more is a
    conflict naming the limit, and decides nothing else."""
    shell = Shell(policy=replace(POLICY, max_branches=max_branches))
    for i in range(3):
        shell.send(PostUserMessage(T, TENANT, f"q{i}", f"question {i}", None, i + 1))
        shell.complete()
    for step, (regenerate, pick) in enumerate(forks, start=10):
        assert shell.state is not None
        users = sorted(s for s, r in shell.records.items() if r.message.role == "user")
        target = shell.records[users[pick % len(users)]].message.message_id
        before = branch_count(shell.state)
        command: Command = RegenerateAnswer(T, TENANT, target, f"k{step}", step) if regenerate \
            else EditMessage(T, TENANT, target, f"e{step}", f"edit {step}", None, step)
        events = shell.send(command)
        shell.complete()
        if isinstance(events[0], RunRejected):
            assert events[0].reason is RejectReason.CONFLICT and "branches" in events[0].detail
            assert before == max_branches and len(events) == 1
        assert branch_count(shell.state) <= max_branches


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(ops=st.lists(OPS, max_size=30), pick=st.integers(0, 50))
def test_any_branch_can_be_made_current_and_none_is_lost(ops: list[Op], pick: int) -> None:
    """Once the thread is idle, a switch to any tip makes it the head, keeps the head
    it left as a tip, and the set of branches (with their paths) stays the same."""
    shell = Shell()
    for step, op in enumerate(ops, start=1):
        run_op(shell, op, step)
    while shell.state is not None and shell.state.active_run is not None:
        shell.complete()
    state = shell.state
    assert state is not None
    if not state.tip_seqs:
        return
    heads = {head_of(state), *state.tip_seqs}
    paths = {seq: shell.path(seq) for seq in heads}
    tip = state.tip_seqs[pick % len(state.tip_seqs)]
    assert shell.send(SwitchBranch(T, TENANT, tip, 99)) == [BranchSwitched(T, tip, 99)]
    assert shell.state is not None and head_of(shell.state) == tip
    assert {head_of(shell.state), *shell.state.tip_seqs} == heads
    assert {seq: shell.path(seq) for seq in heads} == paths
    assert shell.send(SwitchBranch(T, TENANT, tip, 100)) == []  # current already


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(ops=st.lists(OPS, max_size=30))
def test_a_run_answers_from_the_path_above_its_message(ops: list[Op]) -> None:
    """At every first dispatch of a run that did not wait in a queue, the context the
    worker gets is exactly the path from its message's parent up to the root, less the
    messages still queued on it (not context yet, as before branches)."""
    shell = Shell()
    for step, op in enumerate(ops, start=1):
        queued_before = {q.message_id for q in shell.state.queued} if shell.state else set()
        events = run_op(shell, op, step)
        state = shell.state
        for event in events:
            if not isinstance(event, AttemptDispatched) or event.attempt != 1 or state is None:
                continue
            run = state.active_run
            if run is None or run.run_id != event.run_id or event.message_id in queued_before:
                continue
            waiting = {q.seq for q in state.queued}
            above = [seq for seq in shell.path(run.message_seq) if seq != run.message_seq]
            assert list(run_context_seqs(state, shell.records.get)) == \
                [seq for seq in above if seq not in waiting]


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(ops=st.lists(OPS.filter(lambda op: op[0] in ("post", "complete", "fail")),
                               max_size=30))
def test_a_thread_that_never_branches_writes_what_it_always_did(ops: list[Op]) -> None:
    """Posts and answers alone: no record names a parent, the head stays at its default,
    no tip is kept, and the current branch is every message, newest first."""
    shell = Shell()
    for step, op in enumerate(ops, start=1):
        run_op(shell, op, step)
        state = shell.state
        assert state is not None and state.head_seq == -1 and state.tip_seqs == ()
        assert all(r.parent_seq is None for r in shell.records.values())
        assert shell.path(head_of(state)) == sorted(shell.records, reverse=True)


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(ops=st.lists(OPS, max_size=30))
def test_deleting_a_thread_deletes_every_branch(ops: list[Op]) -> None:
    """ThreadDeleted tombstones seq 0 .. message_count - 1: every record of every branch."""
    shell = Shell()
    for step, op in enumerate(ops, start=1):
        run_op(shell, op, step)
    shell.send(DeleteThread(T, TENANT, 10_000))
    assert shell.state is None and shell.records == {}


# --- old records and states ---------------------------------------------------------


@hypothesis.given(count=st.integers(0, 60), removed=st.sets(st.integers(0, 59)))
def test_records_without_parents_read_as_a_straight_line(count: int, removed: set[int]) -> None:
    """Records written before branches (no parent_seq), some tombstoned by rollbacks:
    the path from the newest is every stored record, newest first."""
    records = {seq: MessageRecord(seq, StoredMessage(f"m{seq}", "user", "x", "r", 0))
               for seq in range(count) if seq not in removed}
    assert list(branch_path(count - 1, records.get)) == sorted(records, reverse=True)
    state = ThreadState(T, TENANT, "old", 0, message_count=count)
    assert head_of(state) == count - 1


# The versions of the threads and messages topics' schemas just before branches.
BEFORE_BRANCHES = {"ThreadState": "fe890c78038f5f1a", "MessageRecord": "e5be91610a2dfb10"}


def _retired(name: str) -> tuple[bytes, Any]:
    path = HISTORY_DIR / f"threadline.{name}-{BEFORE_BRANCHES[name]}.avsc"
    schema = fastavro.parse_schema(json.loads(path.read_text()))
    return SINGLE_OBJECT_MARKER + schema_fingerprint(schema), schema


def _written_with(name: str, datum: dict[str, object]) -> bytes:
    header, schema = _retired(name)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, schema, datum)
    return header + body.getvalue()


def test_a_state_written_before_branches_reads_with_its_head_at_the_newest_message() -> None:
    """A ThreadState record of the previous schema decodes with head -1 and no tips."""
    raw = _written_with("ThreadState", {
        "thread_id": T, "tenant": TENANT, "title": "old", "created_at_ms": 1, "active_run": None,
        "idempotency": {}, "message_count": 7, "run_count": 3, "last_run": None,
        "updated_at_ms": 2, "queued": [{"message_id": "m6", "seq": 6, "at_ms": 2}],
        "rolled_back": [], "interrupted": None})
    state = Codec().decode_state(raw)
    assert (state.head_seq, state.tip_seqs, state.interrupted_tip_seq) == (-1, (), -1)
    assert head_of(state) == 6 and state.queued[0].run_id is None and not state.queued[0].branch


def test_a_message_record_written_before_branches_follows_the_message_before_it() -> None:
    """A MessageRecord of the previous schema decodes with no parent: seq - 1."""
    raw = _written_with("MessageRecord", {
        "envelope_id": "e", "thread_id": T, "tenant": TENANT, "produced_at_ms": 1,
        "seq": 5, "message": {"message_id": "m5", "role": "user", "text": "hi", "run_id": "r",
                              "created_at_ms": 1, "steps": [], "citations": []},
        "run_status": None, "run_attempts": 0})
    meta, record = Codec().decode_message(raw)
    assert isinstance(meta, EnvelopeMeta) and record.parent_seq is None
    assert parent_seq_of(record) == 4


@pytest.mark.parametrize("parent", [None, -1, 2])
def test_parents_round_trip_on_the_messages_topic(parent: int | None) -> None:
    """parent_seq: null (the message before), -1 (a root) or a seq, as written."""
    codec = Codec()
    record = MessageRecord(5, StoredMessage("m5", "user", "hi", "r", 1), None, 0, parent)
    meta = EnvelopeMeta("e", T, TENANT, 1, None, None, 1)
    assert codec.decode_message(codec.encode_message(record, meta)) == (meta, record)


def test_a_link_that_is_not_older_reads_as_a_straight_line() -> None:
    """A parent_seq at or past its own seq (no writer of ours makes one) cannot loop."""
    records = {seq: MessageRecord(seq, StoredMessage(f"m{seq}", "user", "x", "r", 0), None, 0, seq)
               for seq in range(4)}
    assert list(branch_path(3, records.get)) == [3, 2, 1, 0]


def tips(shell: Shell) -> tuple[int, ...]:
    """The thread's branch tips."""
    assert shell.state is not None
    return shell.state.tip_seqs


def test_the_worked_example_of_branches() -> None:
    """streams.core.branches' picture: an edit of U2 forks from A1; then a regenerate
    of U0's answer forks from U0, and both earlier heads stay tips."""
    shell = Shell()
    shell.send(PostUserMessage(T, TENANT, "u0", "first", None, 1))
    shell.complete()
    shell.send(PostUserMessage(T, TENANT, "u2", "second", None, 2))
    shell.complete()
    events = shell.send(EditMessage(T, TENANT, "u2", "u4", "second, edited", None, 3))
    assert [type(e).__name__ for e in events] == [
        "MessageAccepted", "BranchSwitched", "RunAccepted", "AttemptDispatched"]
    shell.complete()
    assert shell.path(5) == [5, 4, 1, 0] and shell.records[4].parent_seq == 1
    assert tips(shell) == (3,)
    events = shell.send(RegenerateAnswer(T, TENANT, "u0", "again", 4))
    assert events[0] == RegenerateAccepted(T, "u0", 0, regenerate_run_id_for(T, "again"), "again", 4)
    shell.complete()
    assert shell.path(6) == [6, 0] and tips(shell) == (3, 5)


# --- seeded faults: the properties above can fail -----------------------------------


def _forget_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forks, "key_conflict", lambda *args: None)


def _keep_no_tip(monkeypatch: pytest.MonkeyPatch) -> None:
    switched = branches.with_branch_switched
    monkeypatch.setattr(thread, "with_branch_switched",
                        lambda state, seq: replace(switched(state, seq), tip_seqs=state.tip_seqs))


def _write_no_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "stored_parent", lambda seq, parent: None)


@pytest.mark.parametrize(("fault", "ops"), [
    # A regenerate's key forgotten: sent again under interrupt, its run starts twice.
    (_forget_keys, [("post", 0, 0, REJECT), ("complete", 0, 0, REJECT),
                    ("regenerate", 0, 0, REJECT), ("regenerate", 0, 0, INTERRUPT)]),
    # A switch that keeps no tip: the branch left is lost, and the bound miscounts.
    (_keep_no_tip, [("post", 0, 0, REJECT), ("complete", 0, 0, REJECT),
                    ("regenerate", 0, 0, REJECT), ("complete", 0, 0, REJECT),
                    ("switch", 0, 0, REJECT)]),
    # Records written without their parent: a regenerated answer reads as following
    # the answer before it, not its question.
    (_write_no_parent, [("post", 0, 0, REJECT), ("complete", 0, 0, REJECT),
                        ("regenerate", 0, 0, REJECT), ("complete", 0, 0, REJECT)]),
], ids=["keys-forgotten", "switch-keeps-no-tip", "no-parent-written"])
def test_a_seeded_fault_breaks_a_property(fault: Any, ops: list[Op],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fault, planted in the core, makes `check_invariants` fail on a short history
    (the same history passes without it)."""
    def run_all() -> None:
        shell = Shell()
        for step, op in enumerate(ops, start=1):
            run_op(shell, op, step)
            check_invariants(shell)
        state = shell.state
        assert state is not None
        heads = {head_of(state), *state.tip_seqs}
        assert len(heads) == branch_count(state)  # every branch still named
        if shell.state is not None and shell.state.active_run is None and state.tip_seqs:
            before = {seq: shell.path(seq) for seq in heads}
            shell.send(SwitchBranch(T, TENANT, state.tip_seqs[0], 999))
            assert shell.state is not None
            assert {head_of(shell.state), *shell.state.tip_seqs} == set(before)

    run_all()
    fault(monkeypatch)
    with pytest.raises(AssertionError):
        run_all()
