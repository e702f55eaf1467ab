"""bench.feed_broker's reading of its cases: the line of CPU a second against the rate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.feed_broker import marginal


@given(st.floats(0.0, 100.0), st.floats(0.0, 500.0),
       st.lists(st.integers(100, 20_000), min_size=2, max_size=5, unique=True))
def test_the_line_through_cases_on_one_gives_its_slope_and_intercept(
        per_record_us: float, fixed_ms: float, rates: list[int]) -> None:
    """Cases whose CPU is `fixed_ms` a second plus `per_record_us` a record, read as µs
    per record (as the cases print them), give back both."""
    points = [(float(r), (fixed_ms * 1000 + per_record_us * r) / r) for r in rates]
    slope, intercept = marginal(points)
    assert slope == pytest.approx(per_record_us, abs=1e-6)
    assert intercept == pytest.approx(fixed_ms, abs=1e-6)


def test_a_fetch_cost_paid_whatever_the_rate_is_no_cost_per_record() -> None:
    """The figures of 19abf4b with the batching on (µs a record at 500, 2,000 and 8,000
    records a second): about 80 ms a second whatever the rate, and one record more
    costs next to nothing."""
    slope, intercept = marginal([(500.0, 139.0), (2000.0, 41.5), (8000.0, 10.65)])
    assert 0.0 < slope < 2.0 and 60.0 < intercept < 90.0
