"""The peers benchmark's reading of a side-effect log (bench/peers/workload.py): pure."""

from bench.peers.workload import (
    calls_by_run,
    moving_again,
    parse,
    repeated_calls,
    runs_of,
    step_overheads_ms,
)

LOG = """\
start r1:2 11 1000
done r1:2 11 1010
start r1:4 11 1030
done r1:4 11 1040
begin r2:1 12 1000.5
torn line
done r2:1 12 1200.5
begin r2:2 12 1203.5
done r2:2 12 1403.5
begin r2:2 13 2500
done r2:2 13 2700
begin r2:3 13 2000
"""


def test_overheads_are_done_to_next_begin_in_each_run() -> None:
    """Calls in the order they began; a `start` line is a `begin`; a torn line is skipped."""
    runs = calls_by_run(parse(LOG))
    assert sorted(step_overheads_ms(runs)) == [3.0, 20.0, 596.5]


def test_a_completed_call_begun_again_is_repeated_and_a_cut_off_one_is_not() -> None:
    """A repeat is split by whether the first `done` came before the kill."""
    log = LOG + "begin r1:4 14 3000\nbegin r3:1 15 100\nbegin r3:1 16 900\n"
    runs = calls_by_run(parse(log))
    assert repeated_calls(runs) == (2, 0, 1)
    assert repeated_calls(runs, kill_ms=1100) == (1, 1, 1)


def test_only_the_runs_asked_for() -> None:
    """Other runs' lines are left out."""
    assert list(calls_by_run(parse(LOG), ["r2"])) == ["r2"]


def test_moving_again_waits_for_every_run_in_flight() -> None:
    """The first begin after the kill, and the last run to begin a call or answer."""
    runs = calls_by_run(parse(LOG))
    first, every = moving_again(runs, ["r1", "r2"], 1500, {"r1": 4000})
    assert (first, every) == (500, 2500)
    assert moving_again(runs, ["r1"], 1500, {}) == (None, None)


def test_the_runs_of_a_process_are_those_whose_last_call_it_began() -> None:
    """What a killed process was running: r2's last call before 2100 ms was begun by 13."""
    runs = calls_by_run(parse(LOG))
    assert runs_of(runs, "13", 2100) == ["r2"]
    assert runs_of(runs, "12", 2100) == []
    assert runs_of(runs, "12", 1300) == ["r2"]
