"""The domain's fixed vocabulary: why Threadline cancelled a run, why a run failed.

Each is a str-valued enum whose values are the very strings on the wire
(`RunCancelled.reason`, `RunFailed.error`, `RetryScheduled.reason`), fixed forever:
a member is a `str` and equals its value, so events written before these enums,
which decode as plain strings, read the same (`tests/replay/`).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["CancelReason", "FailureCode"]


class CancelReason(StrEnum):
    """`RunCancelled.reason` when Threadline itself ends a run. A cancel a client asks
    for carries the client's own text instead (see `thread.decide` on `CancelRun`)."""

    # A post with multitask_strategy interrupt: the run's messages are kept and its
    # worker reports the answer so far, stored marked.
    INTERRUPTED = "interrupted"
    # A post with multitask_strategy rollback: the run's message is tombstoned.
    ROLLED_BACK = "rolled_back"
    # The thread was deleted under a live run.
    THREAD_DELETED = "thread deleted"


class FailureCode(StrEnum):
    """Why Threadline ended an attempt or a run: `RunFailed.error`, and for the two
    deadlines `RetryScheduled.reason` too. Some are followed by ": " and details (the
    journal's caps say which cap and its value)."""

    HEARTBEAT_TIMEOUT = "heartbeat_timeout"  # no heartbeat within Policy.heartbeat_timeout_ms
    ATTEMPT_TIMEOUT = "attempt_timeout"  # an attempt ran past Policy.attempt_timeout_ms
    INTERRUPT_TIMEOUT = "interrupt_timeout"  # no resume came within Policy.interrupt_timeout_ms
    OUTPUT_TOO_LARGE = "output_too_large"  # the answer is over Policy.max_output_bytes
    RECORD_TOO_LARGE = "record_too_large"  # a decision's record cannot fit the topic's limit
    TOO_MANY_STEPS = "too_many_steps"  # the journal's cap of steps
    TOO_MANY_TOOL_CALLS = "too_many_tool_calls"  # the journal's cap of tool calls
    STEP_TOO_LARGE = "step_too_large"  # a step, or the journal with it, over its byte cap
