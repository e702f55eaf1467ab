"""Record the replay histories in tests/replay/histories/ from the pure core.

    python -m tests.replay.record_histories

Each scenario is a list of commands; the recorder decides each one with
`streams.core.thread.decide`, folds the events with `evolve`, and writes every event with
the state it made. Run it only on purpose, when a change of the recorded states is
intended (then say so in the commit); the replay tests check today's core against
what was recorded before.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import MappingProxyType

from streams.core.domain import (
    NOTHING_KNOWN,
    ActiveRun,
    CancelRun,
    CheckDeadlines,
    Citation,
    Command,
    CreateThread,
    DeleteThread,
    EditMessage,
    IdempotencyRecord,
    Known,
    MultitaskStrategy,
    Policy,
    PostUserMessage,
    RegenerateAnswer,
    ReportAttemptCompleted,
    ReportAttemptFailed,
    ReportAttemptStarted,
    ReportHeartbeat,
    RunRecord,
    RunStatus,
    Step,
    StoredMessage,
    SwitchBranch,
    ThreadState,
)
from streams.core.ids import regenerate_run_id_for, run_id_for
from streams.core.thread import decide, evolve, next_deadline_ms
from streams.migration import migrated
from streams.testing.replay import History, save_history
from streams.testing.replay import Step as Recorded

HISTORIES = Path(__file__).resolve().parent / "histories"
POLICY = Policy(max_attempts=3, backoff_initial_ms=1_000, heartbeat_timeout_ms=5_000,
                attempt_timeout_ms=60_000, max_output_bytes=64)
THREAD, TENANT, WORKER, T0 = "thread-1", "tenant-a", "worker-1", 1_700_000_000_000

Deadline = Callable[[ThreadState | None], Command]
Looked = tuple[Command, Known]  # a command and what the history table knew for it


def due(now_ms: int | None = None) -> Deadline:
    """The clock's command at the state's next deadline (or at `now_ms`)."""
    return lambda state: CheckDeadlines(THREAD, now_ms if now_ms is not None
                                        else (next_deadline_ms(state, POLICY) or T0))


def record(name: str, description: str, commands: Iterable[Command | Deadline | Looked],
           start: ThreadState | None = None) -> History:
    """Decide and fold `commands` from `start`, keeping every event and its state (a
    command given with a `Known` is decided with what the history table answered)."""
    state, steps = start, []
    for item in commands:
        known = NOTHING_KNOWN
        if isinstance(item, tuple):
            item, known = item
        command = item(state) if callable(item) else item
        for event in decide(state, command, POLICY, known):
            state = evolve(state, event, POLICY)
            steps.append(Recorded(event, state))
    return History(name, description, POLICY, tuple(steps), start)


def post(message_id: str, at: int, text: str = "hello", key: str | None = None,
         strategy: MultitaskStrategy = MultitaskStrategy.REJECT) -> PostUserMessage:
    """A user's message at T0 + `at`, with a multitask strategy for an active run."""
    return PostUserMessage(THREAD, TENANT, message_id, text, key, T0 + at, strategy)


def run(message_id: str) -> str:
    """The run `message_id` starts."""
    return run_id_for(THREAD, message_id)


def started(message_id: str, attempt: int, at: int) -> ReportAttemptStarted:
    """The worker began `attempt` of the message's run."""
    return ReportAttemptStarted(THREAD, run(message_id), attempt, WORKER, T0 + at)


def completed(message_id: str, attempt: int, at: int, text: str = "an answer") -> ReportAttemptCompleted:
    """The worker's answer for `attempt`."""
    return ReportAttemptCompleted(THREAD, run(message_id), attempt, WORKER, text,
                                  (Step("tool_call", "search", '{"q": "x"}'),),
                                  (Citation("https://example.com", "Example"),), T0 + at)


def failed(message_id: str, attempt: int, at: int, retryable: bool = True) -> ReportAttemptFailed:
    """The worker's failure of `attempt`."""
    return ReportAttemptFailed(THREAD, run(message_id), attempt, WORKER, "model timed out",
                               retryable, T0 + at)


CREATE = CreateThread(THREAD, TENANT, "a thread", T0)


def old_form_state() -> History:
    """A 0.1 state (a run active, two earlier messages) migrated, then its run completing."""
    messages = (StoredMessage("m1", "user", "first", run("m1"), T0 + 10),
                StoredMessage(f"{run('m1')}:answer", "assistant", "one", run("m1"), T0 + 20),
                StoredMessage("m2", "user", "second", run("m2"), T0 + 30))
    runs = {run("m1"): RunRecord(run("m1"), "m1", RunStatus.COMPLETED, 1)}
    old = ThreadState(THREAD, TENANT, "old", T0,
                      active_run=ActiveRun(run("m2"), "m2", 1, RunStatus.RUNNING, T0 + 30, T0 + 31, None),
                      idempotency=MappingProxyType({"k1": IdempotencyRecord("m1", run("m1"), "fp")}))
    start, _ = migrated(old, messages, runs, T0 + 40)
    return record("migrated_0_1", "a 0.1 state migrated in place, then its active run completes",
                  [ReportHeartbeat(THREAD, run("m2"), 1, WORKER, T0 + 50), completed("m2", 1, 60)],
                  start)


def histories() -> list[History]:
    """Every recorded scenario."""
    return [
        record("completed", "one message, one attempt, heartbeats, an answer",
               [CREATE, post("m1", 10, key="k1"), started("m1", 1, 20),
                ReportHeartbeat(THREAD, run("m1"), 1, WORKER, T0 + 1_000), completed("m1", 1, 2_000),
                post("m2", 3_000), started("m2", 1, 3_010), completed("m2", 1, 3_020)]),
        record("failed_after_retries", "every attempt fails, retried with backoff until max_attempts",
               [CREATE, post("m1", 10), started("m1", 1, 20), failed("m1", 1, 30), due(),
                started("m1", 2, 2_000), failed("m1", 2, 2_100), due(), started("m1", 3, 5_000),
                failed("m1", 3, 5_100)]),
        record("failed_not_retryable", "a failure the worker says is final ends the run at once",
               [CREATE, post("m1", 10), started("m1", 1, 20), failed("m1", 1, 30, retryable=False)]),
        record("heartbeat_missed", "an attempt whose heartbeats stop is rescheduled, then completes",
               [CREATE, post("m1", 10), started("m1", 1, 20), due(), due(), started("m1", 2, 8_000),
                completed("m1", 2, 8_100), started("m1", 1, 8_200)]),
        record("never_started", "a dispatched attempt no worker starts times out and is redispatched",
               [CREATE, post("m1", 10), due(), due(), started("m1", 2, 9_000),
                completed("m1", 2, 9_100)]),
        record("rejected", "conflict (409) while a run is active, duplicates, invalid and unknown posts",
               [post("m0", 5), CREATE, post("m1", 10, key="k1"), post("m2", 20),
                post("m1", 30), post("m3", 40, key="k1"), post("m4", 50, text=" "),
                post("m5", 60, text="x" * (POLICY.max_input_chars + 1)), started("m1", 1, 70),
                completed("m1", 1, 80), post("m6", 90, text="other", key="k1"), post("m1", 100)]),
        record("cancelled", "a running run cancelled; a late report of it changes nothing",
               [CREATE, post("m1", 10), started("m1", 1, 20),
                CancelRun(THREAD, TENANT, run("m1"), "user asked", T0 + 30), completed("m1", 1, 40),
                post("m2", 50), started("m2", 1, 60), completed("m2", 1, 70)]),
        record("deleted", "a thread deleted while a run is active; a post after finds no thread",
               [CREATE, post("m1", 10), started("m1", 1, 20), DeleteThread(THREAD, TENANT, T0 + 30),
                post("m2", 40), CREATE]),
        record("output_too_large", "an answer over max_output_bytes fails the run; a too-long title",
               [CreateThread(THREAD, TENANT, "t" * (POLICY.max_title_chars + 1), T0), CREATE,
                post("m1", 10), started("m1", 1, 20), completed("m1", 1, 30, text="y" * 100)]),
        old_form_state(),
        *double_texts(),
        branches(),
    ]


# Recorded after the multitask strategies: the histories above were recorded before
# and are kept as they were (`main` writes only missing files unless asked for all).
ENQUEUE, INTERRUPT, ROLLBACK = (MultitaskStrategy.ENQUEUE, MultitaskStrategy.INTERRUPT,
                                MultitaskStrategy.ROLLBACK)


def double_texts() -> list[History]:
    """One history per multitask strategy: a second message while a run is active."""
    return [
        record("double_text_reject", "multitask_strategy reject: the second post is a 409 conflict",
               [CREATE, post("m1", 10), started("m1", 1, 20),
                post("m2", 30, strategy=MultitaskStrategy.REJECT), completed("m1", 1, 40)]),
        record("double_text_enqueue", "enqueue: two messages queued behind a run run once each, "
               "in order, as each run before them ends (a failure and a repeat included)",
               [CREATE, post("m1", 10), started("m1", 1, 20), post("m2", 30, strategy=ENQUEUE),
                post("m3", 40, key="k3", strategy=ENQUEUE), post("m3", 45, key="k3", strategy=ENQUEUE),
                completed("m1", 1, 50), started("m2", 1, 60), failed("m2", 1, 70, retryable=False),
                started("m3", 1, 80), completed("m3", 1, 90)]),
        record("double_text_interrupt", "interrupt: the active run is cancelled (marked "
               "interrupted), then the new message runs; the old run's completion report is its "
               "partial answer, stored once; a second one is fenced",
               [CREATE, post("m1", 10), started("m1", 1, 20), post("m2", 30, strategy=INTERRUPT),
                completed("m1", 1, 40), completed("m1", 1, 45), started("m2", 1, 50),
                completed("m2", 1, 60)]),
        record("double_text_rollback", "rollback: the active run is cancelled (rolled_back) and "
               "its message id stays known; the new message runs",
               [CREATE, post("m1", 10), started("m1", 1, 20), post("m2", 30, strategy=ROLLBACK),
                started("m2", 1, 40), completed("m2", 1, 50), post("m1", 60)]),
    ]


def branches() -> History:
    """Regenerate, edit and switch (issue #30), each with what the history table knew."""
    regen = regenerate_run_id_for(THREAD, "r1")
    first = Known(target_seq=0, target_parent_seq=-1)  # m1: the thread's first message
    return record(
        "branches", "an answer regenerated (twice by one key: one run), an edited first "
        "message, a switch back to the first branch, and a post there",
        [CREATE, post("m1", 10), started("m1", 1, 20), completed("m1", 1, 30),
         (RegenerateAnswer(THREAD, TENANT, "m1", "r1", T0 + 40), first),
         (RegenerateAnswer(THREAD, TENANT, "m1", "r1", T0 + 45), first),
         ReportAttemptStarted(THREAD, regen, 1, WORKER, T0 + 50),
         ReportAttemptCompleted(THREAD, regen, 1, WORKER, "another answer", (), (), T0 + 60),
         (EditMessage(THREAD, TENANT, "m1", "m1-edited", "hello again", None, T0 + 70), first),
         started("m1-edited", 1, 80), completed("m1-edited", 1, 90),
         SwitchBranch(THREAD, TENANT, 1, T0 + 100), post("m2", 110), completed("m2", 1, 120)])


def main() -> int:
    """Write the histories missing from tests/replay/histories/ (`--all`: every one)."""
    HISTORIES.mkdir(exist_ok=True)
    for history in histories():
        path = HISTORIES / f"{history.name}.json"
        if path.exists() and "--all" not in sys.argv:
            continue
        save_history(history, HISTORIES / f"{history.name}.json")
        print(f"{history.name}: {len(history.steps)} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
