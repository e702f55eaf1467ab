"""The chaos program's per-kill measures (chaos/recovery.py): pure."""

from chaos.recovery import KillSpan, moving_again, serving_again

# run -> when a client first saw each of its events (monotonic seconds)
SEEN = {
    "a": [1.0, 2.0, 9.0],    # partition 0: in flight at 5, moves again at 9
    "b": [1.0, 6.0],         # partition 1: in flight at 5, moves again at 6
    "c": [1.0, 2.0],         # partition 1: ended at 3, before the kill
    "d": [7.0, 8.0],         # partition 0: began after the kill
}
PARTITIONS = {"a": 0, "b": 1, "c": 1, "d": 0}
ENDED = {"c": 3.0}


def test_serving_again_is_the_first_event_on_the_dead_instances_partitions() -> None:
    """A processor or worker kill counts events of runs on the partitions it owned."""
    kill = KillSpan("processor", 5.0, frozenset({0}))
    assert serving_again(kill, SEEN, PARTITIONS.get) == 2.0  # d's first event at 7
    assert serving_again(KillSpan("worker", 5.0, frozenset({1})), SEEN, PARTITIONS.get) == 1.0
    assert serving_again(KillSpan("broker", 5.0, None), SEEN, PARTITIONS.get) == 1.0
    # a broker: the first event seen once it is back (what came just after the kill was sent before)
    back = KillSpan("broker", 5.0, None, back_at=7.5)
    assert serving_again(back, SEEN, PARTITIONS.get) == 3.0


def test_a_gateway_serves_again_when_its_probe_says_so() -> None:
    """A gateway owns no partition: its /healthz is the measure; never, if it never came."""
    assert serving_again(KillSpan("gateway", 5.0, None, 7.5), SEEN, PARTITIONS.get) == 2.5
    assert serving_again(KillSpan("gateway", 5.0, None), SEEN, PARTITIONS.get) is None


def test_moving_again_waits_for_every_run_in_flight_at_the_kill() -> None:
    """Runs ended before the kill or begun after it do not count; a run in flight that
    never moves again counts until the drain ended."""
    kill = KillSpan("worker", 5.0, frozenset({0}))
    assert moving_again(kill, SEEN, ENDED, drained_at=100.0) == 4.0  # a, at 9
    stuck = {**SEEN, "e": [4.0]}
    assert moving_again(kill, stuck, ENDED, drained_at=100.0) == 95.0
    assert moving_again(kill, stuck, {**ENDED, "e": 5.5}, drained_at=100.0) == 4.0


def test_no_run_in_flight_has_no_figure() -> None:
    """A kill between runs has nothing to measure: None, not 0."""
    assert moving_again(KillSpan("worker", 0.5, None), SEEN, ENDED, drained_at=100.0) is None
