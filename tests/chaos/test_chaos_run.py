"""The chaos program as `make test` and `make chaos` run it: processes killed with
SIGKILL, the broker restarted, and nothing lost, duplicated or skipped (see
chaos/audit.py).

In `make test`: the two controls of the topic audit. The processors' fault point
(streams/kafka/faults.py) ends a processor between a step's write and its commit,
every time, not by chance: under at_least_once the audit must find the replayed
batch's records twice (the negative control), under exactly_once the same fault
must pass. They run on the session broker (no broker is killed).

Behind `-m chaos` (docs/chaos.md, "In make test" lists what stands for them): the
small preset and the three-broker preset, each on a broker of its own so the
broker restart cannot hurt the session broker of the other tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]


def _chaos(tmp_path: Path, *args: str, timeout: float, passes: bool = True,
           bootstrap: str | None = None) -> dict[str, str]:
    """Run `python -m chaos` and return its table row by column."""
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap} if bootstrap else None
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "--folder", str(tmp_path / "chaos"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    print(proc.stdout)
    assert proc.returncode == (0 if passes else 1), \
        f"{proc.stdout}\n--- stderr (tail)\n{proc.stderr[-4000:]}"
    assert proc.stdout.startswith("| seed |"), proc.stdout
    header, _, row = proc.stdout.splitlines()[:3]
    names = [c.strip() for c in header.strip("|").split("|")]
    values = [c.strip() for c in row.strip("|").split("|")]
    return {"stdout": proc.stdout, **dict(zip(names, values, strict=True))}


@pytest.mark.timeout(600)  # a safety net: the run itself waits on progress, not the clock
def test_the_topic_audit_fails_an_at_least_once_processor_killed_before_its_commit(
        tmp_path: Path, kafka_bootstrap: str) -> None:
    """The negative control: a processor in at_least_once mode ended by the fault
    point after its batch's records were flushed and before its offsets were
    committed replays the batch, and the topic audit finds its records twice (the
    answers audit alone would pass such a run)."""
    row = _chaos(tmp_path, "--preset", "control", "--seed", "7", "--fault-point", "before-commit",
                 "--processing-guarantee", "at_least_once", timeout=580, passes=False,
                 bootstrap=kafka_bootstrap)
    assert row["aimed kills"] == "1", row["stdout"]  # the fault point fired
    assert "committed records with identity" in row["stdout"], row["stdout"]


@pytest.mark.timeout(600)
def test_the_same_fault_point_passes_every_audit_under_exactly_once(
        tmp_path: Path, kafka_bootstrap: str) -> None:
    """The positive control: the same fault point under exactly_once leaves the
    step's transaction open; the restart aborts it (the audit counts its records
    as aborted, none visible) and the replay's copy is the only one."""
    row = _chaos(tmp_path, "--preset", "control", "--seed", "7", "--fault-point", "before-commit",
                 timeout=580, bootstrap=kafka_bootstrap)
    assert row["aimed kills"] == "1", row["stdout"]
    assert int(row["aborted records"]) > 0, row["stdout"]  # the fault landed inside a transaction


@pytest.mark.timeout(600)
@pytest.mark.skipif(bool(os.environ.get("KAFKA_BOOTSTRAP_SERVERS")),
                    reason="the broker restarted is the chaos program's own")
def test_the_fault_point_and_a_broker_restart_under_exactly_once_pass_every_audit(
        tmp_path: Path) -> None:
    """The small preset's property at a third of its size: the whole stack on a broker
    of its own, a processor ended inside a transaction by the fault point and the
    broker killed and started again under every role, and every audit passes."""
    row = _chaos(tmp_path, "--preset", "control-restart", "--seed", "7",
                 "--fault-point", "before-commit", timeout=580)
    assert row["aimed kills"] == "1", row["stdout"]
    assert row["kills p/w/g/b"] == "1/0/0/1", row["stdout"]


@pytest.mark.chaos_sized
@pytest.mark.timeout(420)
def test_small_chaos_run_loses_duplicates_and_skips_nothing(tmp_path: Path) -> None:
    """The small chaos preset, with its kills, passes every audit."""
    _chaos(tmp_path, "--preset", "small", "--seed", "7", timeout=400)


@pytest.mark.chaos_sized
@pytest.mark.timeout(420)
@pytest.mark.skipif(bool(os.environ.get("KAFKA_BOOTSTRAP_SERVERS")),
                    reason="the three-node cluster is the chaos program's own")
def test_chaos_on_three_brokers_with_one_killed_mid_run(tmp_path: Path) -> None:
    """The chaos program on three brokers, one killed mid-run, passes every audit."""
    _chaos(tmp_path, "--preset", "cluster", "--seed", "3", timeout=400)
