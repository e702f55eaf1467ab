"""The watchdog of transactional calls: a call that hangs far past its own timeout
ends the process, and a restart recovers.

librdkafka 2.16's `send_offsets_to_transaction` can block far past its timeout
after a broker restart (seen in the chaos run: minutes, until the process was
stopped). The group then waits `max.poll.interval.ms` (5 min) for this member
and its partitions stall. Crash-only instead: the restarted instance's
`init_transactions` aborts the open transaction and the group moves on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator

__all__ = ["HUNG_EXIT_STATUS", "Watchdog"]

log = logging.getLogger("threadline.kafka.watchdog")

HUNG_EXIT_STATUS = 70


class Watchdog:
    """Exits the process when a guarded call overruns its limit."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._call: tuple[str, float] | None = None  # what runs, and its deadline
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run the block under watch: past `limit_s`, the process exits."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="txn-watchdog", daemon=True)
            self._thread.start()
        self._call = (what, time.monotonic() + self.limit_s)
        try:
            yield
        finally:
            self._call = None

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            call = self._call
            if call is not None and time.monotonic() > call[1]:
                log.critical("%s hung past its timeout; exiting so a restart recovers", call[0])
                logging.shutdown()
                os._exit(HUNG_EXIT_STATUS)
