"""A deterministic fault point of the table loop, for the chaos program's controls.

What exactly-once adds over at-least-once shows only when a process dies between
writing a step's records and committing its input offsets. A kill from outside
lands there by chance; this fault point lands there every time.

`THREADLINE_FAULT_EXIT_BEFORE_COMMIT=<path>` arms it in a process (nothing else
does, and without the variable the loop never looks). While the file at `<path>`
exists and holds a key prefix, the first step whose records include one keyed
with that prefix takes the file (renames it to `<path>.fired-<pid>`, so of the
processes sharing one trigger exactly one fires, once), flushes its producer (the
step's records are then on the broker) and exits with `FAULT_EXIT_STATUS`:

- at least once: after the records were flushed, before the offsets are
  committed; the restarted consumer reads the batch again and writes its records
  a second time;
- exactly once: after the records were produced and the offsets sent to the
  transaction, before it commits; the restarted instance's `init_transactions`
  aborts it, and a `read_committed` reader sees only the replay's copy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

__all__ = ["FAULT_ENV", "FAULT_EXIT_STATUS", "CommitFault", "arm", "commit_fault"]

FAULT_ENV = "THREADLINE_FAULT_EXIT_BEFORE_COMMIT"
FAULT_EXIT_STATUS = 86


class _Keyed(Protocol):
    @property
    def key(self) -> bytes: ...


class _Flushes(Protocol):
    def flush(self, timeout: float) -> int: ...


CommitFault = Callable[[Sequence[_Keyed], _Flushes], None]


def arm(trigger: Path, key_prefix: str) -> None:
    """Arm the fault point of every process whose `FAULT_ENV` is `trigger`: the first
    step that writes a record keyed with `key_prefix` exits before its commit."""
    staged = trigger.with_name(trigger.name + ".staged")
    staged.write_text(key_prefix)
    os.replace(staged, trigger)  # whole, never half-written


def commit_fault(env: Mapping[str, str] | None = None) -> CommitFault | None:
    """The fault point `FAULT_ENV` arms in this process, or None (the default)."""
    path = (os.environ if env is None else env).get(FAULT_ENV)
    if not path:
        return None
    trigger = Path(path)

    def before_commit(outputs: Sequence[_Keyed], producer: _Flushes) -> None:
        try:
            prefix = trigger.read_bytes()
        except FileNotFoundError:
            return
        if not prefix or not any(out.key.startswith(prefix) for out in outputs):
            return
        try:  # of the processes sharing the trigger, the one whose rename succeeds fires
            os.rename(trigger, trigger.with_name(f"{trigger.name}.fired-{os.getpid()}"))
        except FileNotFoundError:
            return
        producer.flush(30)
        sys.stderr.write(f"fault point: exiting between the write and the commit of a step "
                         f"({len(outputs)} records)\n")
        sys.stderr.flush()
        os._exit(FAULT_EXIT_STATUS)

    return before_commit
