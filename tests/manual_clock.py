"""A clock the test sets by hand, for code that takes a `clock` callable."""

from __future__ import annotations


class ManualClock:
    """Returns `now`, which the test moves."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        """The current fake time in seconds."""
        return self.now
