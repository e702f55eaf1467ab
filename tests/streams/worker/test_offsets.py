"""A dispatch partition's offsets: what the worker may commit while attempts run."""

from __future__ import annotations

from streams.worker.offsets import PartitionOffsets


def test_commit_position_is_the_lowest_running_offset() -> None:
    """Shows the commit position is the lowest running offset, else one past the last finished."""
    offsets = PartitionOffsets()
    assert offsets.position() is None
    for o in (5, 6, 7):
        assert offsets.take(o)
    assert offsets.position() == 5
    offsets.finish(6)
    assert offsets.position() == 5  # 5 still runs: 6 may not be committed past it
    offsets.finish(5)
    assert offsets.position() == 7
    offsets.finish(7)
    assert offsets.position() == 8
    # Fetched again after a rebalance: neither running nor finished records run twice.
    assert not offsets.take(6) and not offsets.take(7)
    assert offsets.take(9) and not offsets.take(9)
    assert offsets.position() == 9


def test_records_fetched_again_while_an_earlier_one_runs_are_not_taken_twice() -> None:
    """Shows records fetched again while an earlier one runs are not taken again, running or finished."""
    offsets = PartitionOffsets()
    for o in (1, 2, 3):
        offsets.take(o)
    offsets.finish(3)
    assert offsets.position() == 1
    assert [offsets.take(o) for o in (1, 2, 3, 4)] == [False, False, False, True]
