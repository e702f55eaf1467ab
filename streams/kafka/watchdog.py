"""The watchdog of transactional calls: a call that hangs far past its own timeout
ends the process, and a restart recovers.

librdkafka 2.16's `send_offsets_to_transaction` can block far past its timeout
after a broker restart (seen in the chaos run: minutes, until the process was
stopped). The group then waits `max.poll.interval.ms` (5 min) for this member
and its partitions stall. Crash-only instead: the restarted instance's
`init_transactions` aborts the open transaction and the group moves on.

The cause is librdkafka #5456: the call's coordinator request never checks its
timeout and is moved on only by a broker connection going up or down. So a call
that overruns while the broker is down is not hung: it goes on when the broker is
back, sooner than a restart would (a cold start and a restore). With a `reachable`
probe, an overrun call ends the process only once the broker has accepted
connections for `grace_s` and the call still has not returned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["HUNG_EXIT_STATUS", "Watchdog"]

log = logging.getLogger("threadline.kafka.watchdog")

HUNG_EXIT_STATUS = 70


class Watchdog:
    """Exits the process when a guarded call overruns its limit."""

    def __init__(self, limit_s: float, reachable: Callable[[], bool] | None = None,
                 grace_s: float = 3.0) -> None:
        self.limit_s = limit_s
        self.reachable = reachable
        self.grace_s = grace_s
        self._call: tuple[str, float] | None = None  # what runs, and its deadline
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run the block under watch: past `limit_s` (and, with a probe, once the
        broker has accepted connections for `grace_s`), the process exits."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="txn-watchdog", daemon=True)
            self._thread.start()
        self._call = (what, time.monotonic() + self.limit_s)
        try:
            yield
        finally:
            self._call = None

    def _watch(self) -> None:
        up_since: float | None = None  # the broker accepting connections since, while overdue
        while True:
            time.sleep(1.0)
            call = self._call
            if call is None or time.monotonic() <= call[1]:
                up_since = None
                continue
            if self.reachable is not None:
                if not self.reachable():
                    up_since = None
                    continue
                up_since = up_since or time.monotonic()
                if time.monotonic() - up_since < self.grace_s:
                    continue
            if call is self._call:
                log.critical("%s hung past its timeout; exiting so a restart recovers", call[0])
                logging.shutdown()
                os._exit(HUNG_EXIT_STATUS)
