"""What the console's run timeline shows of a run's events: pure.

The timeline is made from the run's own events as the stream topic holds them, each
with its record's time (`ts`), never from when a browser happened to receive them: the
same events give the same entries live (the thread's SSE stream) and after a reload
(`GET /v1/console/threads/{id}/runs`, which replays each ended run's events and keeps
these). Text deltas, steps and citations are the answer, not the timeline: they stay
out, so a run's timeline is bounded by its attempts and interrupts, not by its answer.
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["MAX_DETAIL_CHARS", "MAX_ENTRIES_PER_RUN", "TIMELINE_EVENTS", "timeline_entry"]

# The SSE event names the timeline shows (streams.core.lifecycle.Lifecycle and the
# message's start and end, which say when an attempt's execution began and ended).
TIMELINE_EVENTS: Final = frozenset({
    "run_accepted", "attempt_dispatched", "message_start", "message_end", "retry_scheduled",
    "interrupt", "run_completed", "run_failed", "run_cancelled",
})
# The fields of an event the timeline reads; the rest (a terminal event's whole
# stored message, ids of messages) is left out.
_FIELDS: Final = ("run_id", "attempt", "ts", "seq", "detail", "finish_reason")
MAX_ENTRIES_PER_RUN: Final = 500  # a run interrupted and resumed without end stays bounded
MAX_DETAIL_CHARS: Final = 2_000


def timeline_entry(name: str, data: bytes | str) -> dict[str, Any] | None:
    """The timeline's view of one SSE event (its name and JSON data), or None if the
    timeline does not show it: `{"event": name}` and the fields it reads, a long
    `detail` (but an interrupt's payload) cut to MAX_DETAIL_CHARS."""
    if name not in TIMELINE_EVENTS:
        return None
    fields = json.loads(data)
    entry: dict[str, Any] = {"event": name}
    for key in _FIELDS:
        if fields.get(key) is not None:
            entry[key] = fields[key]
    detail = entry.get("detail")
    # An interrupt's detail is its payload, JSON the console reads whole (bounded by
    # the journal's entry size); other details are messages, cut if long.
    if name != "interrupt" and isinstance(detail, str) and len(detail) > MAX_DETAIL_CHARS:
        entry["detail"] = detail[:MAX_DETAIL_CHARS] + "…"
    return entry
