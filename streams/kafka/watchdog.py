"""The watchdog of transactional calls: each call runs on a thread of its own, and
one that hangs far past its own timeout is left behind, with its producer, instead
of holding up the process.

librdkafka 2.16's `send_offsets_to_transaction` can block far past its timeout
after a broker restart (seen in the chaos run: minutes, until the process was
stopped). The cause is librdkafka #5456: the call's coordinator request never
checks its timeout, and is moved on only by a broker connection going up or down
(#5511: a decommissioned coordinator's never does). So a call that overruns while
the broker is down is not hung: it goes on when the broker is back. With a
`reachable` probe, an overrun call counts as hung only once the broker has
accepted connections for `grace_s` and the call still has not returned.

A hung call raises `CallHung` in the caller; the thread stays blocked in
librdkafka, and the table loop drops the producer it was called on and starts a
new one with the same transactional id, whose `init_transactions` fences the old
one and aborts its transaction. The process stays up and warm. (Until 2026-12-02
the watchdog ended the process instead, status 70, and a supervisor's restart
recovered: a cold start and a group rejoin, in chaos runs the longest stall after
a broker restart.)
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["HUNG_EXIT_STATUS", "CallHung", "Watchdog"]

log = logging.getLogger("threadline.kafka.watchdog")

# What a process exits with when hung calls keep coming (streams.kafka.loop).
HUNG_EXIT_STATUS = 70


class CallHung(Exception):
    """A watched call overran its limit while the broker answered: it was left behind."""


class _Outcome:
    """One call's result, filled in by the call thread."""

    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class _CallThread:
    """A daemon thread that runs the calls it is given, one at a time."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], _Outcome]] = \
            queue.SimpleQueue()
        threading.Thread(target=self._serve, name="txn-call", daemon=True).start()

    def _serve(self) -> None:
        while True:
            call, args, outcome = self.requests.get()
            try:
                outcome.value = call(*args)
            except BaseException as exc:  # handed to the caller, whatever it is
                outcome.error = exc
            outcome.done.set()


class Watchdog:
    """Runs calls with a limit on how long they may hang (see the module doc)."""

    def __init__(self, limit_s: float, reachable: Callable[[], bool] | None = None,
                 grace_s: float = 2.0, poll_s: float = 0.5) -> None:
        self.limit_s = limit_s
        self.reachable = reachable
        self.grace_s = grace_s
        self.poll_s = poll_s
        self._thread: _CallThread | None = None
        self.left_behind = 0  # hung calls so far, each still blocking a thread

    def call(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)` on the call thread: its result, or its exception re-raised;
        `CallHung` once it hangs (see the module doc)."""
        if self._thread is None:
            self._thread = _CallThread()
        outcome = _Outcome()
        self._thread.requests.put((call, args, outcome))
        overdue_at = time.monotonic() + self.limit_s
        up_since: float | None = None  # the broker accepting connections since, while overdue
        while not outcome.done.wait(self.poll_s):
            now = time.monotonic()
            if now < overdue_at:
                continue
            if self.reachable is not None:
                if not self.reachable():
                    up_since = None
                    continue
                up_since = up_since or now
                if now - up_since < self.grace_s:
                    continue
            self._thread = None  # blocked in the call: the next call gets a new thread
            self.left_behind += 1
            log.error("%s hung past its timeout (librdkafka #5456); left behind", what)
            raise CallHung(what)
        if outcome.error is not None:
            raise outcome.error
        return outcome.value
