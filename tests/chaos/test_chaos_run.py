"""The chaos program as `make test` and `make chaos` run it: processes killed with
SIGKILL, the broker restarted, and nothing lost, duplicated or skipped (see
chaos/audit.py).

In `make test`: the two controls of the topic audit. The processors' fault point
(streams/kafka/faults.py) ends a processor between a step's write and its commit,
every time, not by chance: under at_least_once the audit must find the replayed
batch's records twice (the negative control), under exactly_once the same fault
must pass. They run on the session broker (no broker is killed). With them, the
positive control once more with a broker restart, on a broker of its own. The three
runs start together (the `controls` fixture) and each test audits its own.

Behind `-m chaos` (docs/chaos.md, "In make test" lists what stands for them): the
small preset and the three-broker preset, each on a broker of its own so the
broker restart cannot hurt the session broker of the other tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]


def _start(folder: Path, *args: str, bootstrap: str | None = None) -> subprocess.Popen[str]:
    """Start `python -m chaos` in `folder`, its output to files there (not pipes: a run
    waiting its turn to be read would block once a pipe's buffer were full)."""
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap} if bootstrap else None
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "stdout.txt").open("w") as out, (folder / "stderr.txt").open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "chaos", "--folder", str(folder / "chaos"), *args],
            cwd=ROOT, stdout=out, stderr=err, text=True, env=env)


def _row(folder: Path, proc: subprocess.Popen[str], *, timeout: float,
         passes: bool = True) -> dict[str, str]:
    """Wait for the `python -m chaos` run started in `folder` and return its table row by column."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    stdout = (folder / "stdout.txt").read_text()
    stderr = (folder / "stderr.txt").read_text()
    print(stdout)
    assert proc.returncode == (0 if passes else 1), \
        f"{stdout}\n--- stderr (tail)\n{stderr[-4000:]}"
    assert stdout.startswith("| seed |"), stdout
    header, _, row = stdout.splitlines()[:3]
    names = [c.strip() for c in header.strip("|").split("|")]
    values = [c.strip() for c in row.strip("|").split("|")]
    return {"stdout": stdout, **dict(zip(names, values, strict=True))}


def _chaos(tmp_path: Path, *args: str, timeout: float, passes: bool = True,
           bootstrap: str | None = None) -> dict[str, str]:
    """Run `python -m chaos` and return its table row by column."""
    return _row(tmp_path, _start(tmp_path, *args, bootstrap=bootstrap), timeout=timeout,
                passes=passes)


Run = tuple[Path, "subprocess.Popen[str]"]  # a control run's folder and process
_FAULT = ("--seed", "7", "--fault-point", "before-commit")
# The three runs of make test, by the test that reads each: its arguments, and whether
# it runs on the session broker (the control-restart one restarts a broker of its own).
_CONTROLS = {
    "test_the_topic_audit_fails_an_at_least_once_processor_killed_before_its_commit":
        (("--preset", "control", *_FAULT, "--processing-guarantee", "at_least_once"), True),
    "test_the_same_fault_point_passes_every_audit_under_exactly_once":
        (("--preset", "control", *_FAULT), True),
    "test_the_fault_point_and_a_broker_restart_under_exactly_once_pass_every_audit":
        (("--preset", "control-restart", *_FAULT), False),
}


@pytest.fixture(scope="module")
def controls(request: pytest.FixtureRequest, kafka_bootstrap: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """The control runs of the tests selected in this session, started together: each
    posts for a fixed 15-25 s and then waits on progress, so side by side they take
    little longer than the longest alone (about 1 min 40 s instead of 2 min 40 s
    one after another). Each test waits for its own run and audits its row."""
    selected = {item.name for item in request.session.items
                if not any(m.name == "skip" for m in item.iter_markers())}
    started: dict[str, Run] = {}
    try:
        for name, (args, on_session_broker) in _CONTROLS.items():
            if name not in selected or (not on_session_broker and os.environ.get(
                    "KAFKA_BOOTSTRAP_SERVERS")):
                continue
            folder = tmp_path_factory.mktemp("control")
            started[name] = (folder, _start(folder, *args, bootstrap=kafka_bootstrap
                                            if on_session_broker else None))
        yield started
    finally:
        for _, proc in started.values():
            if proc.poll() is None:
                proc.terminate()  # the chaos program stops its stack on SIGTERM
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.mark.timeout(600)  # a safety net: the run itself waits on progress, not the clock
def test_the_topic_audit_fails_an_at_least_once_processor_killed_before_its_commit(
        controls: dict[str, Run]) -> None:
    """The negative control: a processor in at_least_once mode ended by the fault
    point after its batch's records were flushed and before its offsets were
    committed replays the batch, and the topic audit finds its records twice (the
    answers audit alone would pass such a run)."""
    row = _row(*controls[test_the_topic_audit_fails_an_at_least_once_processor_killed_before_its_commit
                        .__name__], timeout=580, passes=False)
    assert row["aimed kills"] == "1", row["stdout"]  # the fault point fired
    assert "committed records with identity" in row["stdout"], row["stdout"]


@pytest.mark.timeout(600)
def test_the_same_fault_point_passes_every_audit_under_exactly_once(
        controls: dict[str, Run]) -> None:
    """The positive control: the same fault point under exactly_once leaves the
    step's transaction open; the restart aborts it (the audit counts its records
    as aborted, none visible) and the replay's copy is the only one."""
    row = _row(*controls[test_the_same_fault_point_passes_every_audit_under_exactly_once.__name__],
               timeout=580)
    assert row["aimed kills"] == "1", row["stdout"]
    assert int(row["aborted records"]) > 0, row["stdout"]  # the fault landed inside a transaction


@pytest.mark.timeout(600)
@pytest.mark.skipif(bool(os.environ.get("KAFKA_BOOTSTRAP_SERVERS")),
                    reason="the broker restarted is the chaos program's own")
def test_the_fault_point_and_a_broker_restart_under_exactly_once_pass_every_audit(
        controls: dict[str, Run]) -> None:
    """The small preset's property at a third of its size: the whole stack on a broker
    of its own, a processor ended inside a transaction by the fault point and the
    broker killed and started again under every role, and every audit passes."""
    row = _row(*controls[
        test_the_fault_point_and_a_broker_restart_under_exactly_once_pass_every_audit.__name__],
        timeout=580)
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


@pytest.mark.chaos_sized
@pytest.mark.timeout(600)
@pytest.mark.skipif(bool(os.environ.get("KAFKA_BOOTSTRAP_SERVERS")),
                    reason="the broker restarted is the chaos program's own")
@pytest.mark.parametrize("preset", ["gateways", "gateways-by-owner"])
def test_chaos_on_three_grouped_gateways_behind_haproxy(tmp_path: Path, preset: str) -> None:
    """The gateways preset at half its posting time: three gateways sharing the stream
    as a group, every client through HAProxy (random routing; or by owner, with
    deploy/haproxy/threadline.lua), gateways killed most, and every audit passes
    (issue #26)."""
    from streams.testing.haproxy import haproxy_binary
    if haproxy_binary() is None:
        pytest.skip("haproxy is not installed (make system-deps)")
    row = _chaos(tmp_path, "--preset", preset, "--seed", "11", "--duration", "60",
                 timeout=580)
    assert row["kills p/w/g/b"].split("/")[2] != "0", row["stdout"]
