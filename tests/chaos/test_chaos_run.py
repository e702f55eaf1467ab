"""The chaos program at a small, fixed-seed size: processes killed with SIGKILL, the
broker restarted, and nothing lost, duplicated or skipped (see chaos/audit.py).

It runs `python -m chaos` as `make chaos` does, on a broker of its own, so the
broker restart cannot hurt the session broker of the other tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]


def _chaos(tmp_path: Path, *args: str, timeout: float, passes: bool = True) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "chaos", "--folder", str(tmp_path / "chaos"), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    print(proc.stdout)
    assert proc.returncode == (0 if passes else 1), \
        f"{proc.stdout}\n--- stderr (tail)\n{proc.stderr[-4000:]}"
    assert proc.stdout.startswith("| seed |"), proc.stdout
    return proc.stdout


@pytest.mark.timeout(420)
def test_small_chaos_run_loses_duplicates_and_skips_nothing(tmp_path: Path) -> None:
    """The small chaos preset, with its kills, passes every audit."""
    _chaos(tmp_path, "--preset", "small", "--seed", "7", timeout=400)


@pytest.mark.timeout(420)
@pytest.mark.skipif(bool(os.environ.get("KAFKA_BOOTSTRAP_SERVERS")),
                    reason="the three-node cluster is the chaos program's own")
def test_chaos_on_three_brokers_with_one_killed_mid_run(tmp_path: Path) -> None:
    """The chaos program on three brokers, one killed mid-run, passes every audit."""
    _chaos(tmp_path, "--preset", "cluster", "--seed", "3", timeout=400)


@pytest.mark.timeout(420)
def test_the_topic_audit_fails_an_at_least_once_processor_under_the_same_kills(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The negative control: with the processors in at_least_once mode, the aimed
    processor kills leave a replayed batch's records twice on the topics, and the
    audit says so (the answers audit alone passes such a run)."""
    if "chaos" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the negative control runs with -m chaos")
    out = _chaos(tmp_path, "--preset", "small", "--seed", "7",
                 "--processing-guarantee", "at_least_once", timeout=400, passes=False)
    assert "committed records with identity" in out, out
