"""The wall clock, in the milliseconds every record and command carries.

Its own module so that the pure modules (`streams.core.ids`, `streams.core.lifecycle`,
`streams.core.thread`) never read the clock: time reaches them as an argument.
"""

from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    """Milliseconds since the epoch, now."""
    return int(time.time() * 1000)
