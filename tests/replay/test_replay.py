"""Replay tests: every recorded history in tests/replay/histories/ folds, through
today's `streams.core.thread.evolve`, to the states that were recorded; and a seeded fault
in the core (a misread field) makes the replay fail, so these tests can fail."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from streams.core import branches, thread
from streams.core.domain import RetryScheduled, RunStatus
from streams.testing.replay import History, ReplayMismatch, load_history, replay, to_json
from tests.replay.record_histories import HISTORIES, histories

FILES = sorted(HISTORIES.glob("*.json"))
KINDS = {"completed", "failed_after_retries", "failed_not_retryable", "heartbeat_missed", "never_started",
         "rejected", "cancelled", "deleted", "output_too_large", "migrated_0_1",
         "double_text_reject", "double_text_enqueue", "double_text_interrupt",
         "double_text_rollback", "branches"}


def _load(name: str) -> History:
    return load_history(HISTORIES / f"{name}.json")


def test_every_kind_of_run_is_recorded() -> None:
    """Every kind of run in KINDS has a recorded history, and nothing else does."""
    assert {f.stem for f in FILES} == KINDS


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_recorded_history_replays_to_the_recorded_states(path: Path) -> None:
    """A recorded history replays through today's `evolve` to its recorded states."""
    replay(load_history(path))


def test_today_decides_the_recorded_events() -> None:
    """The recorder run today writes what is checked in: a change to `decide` shows
    here and is recorded again on purpose (python -m tests.replay.record_histories)."""
    for history in histories():
        recorded = _load(history.name)
        assert [to_json(s.event) for s in history.steps] == [to_json(s.event) for s in recorded.steps], \
            history.name
        assert to_json(history.start) == to_json(recorded.start), history.name


def test_a_status_misread_fails_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded fault: an ended run's status mapped wrong (every end read as FAILED)."""
    end_run = thread._end_run

    def misread(state: Any, run: Any, status: RunStatus, at_ms: int) -> Any:
        return end_run(state, run, RunStatus.FAILED, at_ms)

    monkeypatch.setattr(thread, "_end_run", misread)
    replay(_load("failed_after_retries"))  # FAILED is what it was: no difference there
    with pytest.raises(ReplayMismatch, match="RunCompleted"):
        replay(_load("completed"))


def test_a_renamed_field_fails_the_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded fault: RetryScheduled's due time read from another field (its at_ms)."""
    run_event = thread._run_event

    def misread(state: Any, event: Any, *rest: Any) -> Any:
        if isinstance(event, RetryScheduled):
            event = replace(event, due_ms=event.at_ms)
        return run_event(state, event, *rest)

    monkeypatch.setattr(thread, "_run_event", misread)
    with pytest.raises(ReplayMismatch, match="RetryScheduled"):
        replay(_load("heartbeat_missed"))


def test_a_switch_that_forgets_the_branch_it_leaves_fails_the_replay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded fault: BranchSwitched moves the head but keeps no tip of the branch left."""
    switched = branches.with_branch_switched

    def forgetful(state: Any, seq: int) -> Any:
        return replace(switched(state, seq), tip_seqs=state.tip_seqs)

    monkeypatch.setattr(thread, "with_branch_switched", forgetful)
    with pytest.raises(ReplayMismatch, match="BranchSwitched"):
        replay(_load("branches"))
