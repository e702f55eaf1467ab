"""What a kill cost the clients, per kill (pure: the clients' observations in, seconds out).

Three figures, each from the kill (monotonic seconds), the worst per kind in a run:

- **recovery** (the old figure, kept for continuity): until the killed role serves
  again by the chaos program's probes (a restarted gateway's /healthz, a group
  stable with two members) or until every run in flight at the kill has ended,
  whichever is later;
- **serving again**: the first event a client saw after the kill of a run on a
  partition the killed instance owned (its assignment when it died): for a
  processor, a decision (a lifecycle event: tokens come from the workers); for a
  worker, any event (what a dispatch started, or a decision); a gateway's restart,
  the moment it answers /healthz 200; a broker's, the first event of any run seen
  after the broker was back (what reached clients just after the kill was sent
  before it);
- **runs moving again**: every run in flight at the kill (a client had seen one of
  its events and not its end) has had a new event seen, or its end: its next step,
  token or terminal event, as its clients feel it.

Events are timed when a client first saw them (any watcher of the run, thread or run
stream), so a client that was cut off and reconnects late counts late: that is what
its user felt.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

__all__ = ["KillSpan", "moving_again", "serving_again"]


@dataclass(frozen=True, slots=True)
class KillSpan:
    """One kill as the measures need it."""

    kind: str  # processor | worker | gateway | broker
    at: float  # monotonic
    owned: frozenset[int] | None  # partitions the killed instance owned; None: all
    restored_at: float | None = None  # the probes' "serving again" (gateway, broker)
    back_at: float | None = None  # a restarted broker ready again


def _first_after(times: list[float], at: float) -> float | None:
    index = bisect.bisect_right(times, at)
    return times[index] if index < len(times) else None


def _runs_on(seen_at: Mapping[str, list[float]], owned: frozenset[int] | None,
             partition_of: Callable[[str], int | None]) -> Iterable[str]:
    for run in seen_at:
        partition = partition_of(run)
        if owned is None or (partition is not None and partition in owned):
            yield run


def serving_again(kill: KillSpan, seen_at: Mapping[str, list[float]],
                  partition_of: Callable[[str], int | None]) -> float | None:
    """Seconds from the kill to the first event seen of a run on the killed instance's
    partitions (a gateway: its /healthz); None if none came."""
    if kill.kind == "gateway":
        return None if kill.restored_at is None else kill.restored_at - kill.at
    since = kill.back_at if kill.kind == "broker" and kill.back_at is not None else kill.at
    firsts = [t for run in _runs_on(seen_at, kill.owned, partition_of)
              if (t := _first_after(seen_at[run], since)) is not None]
    return min(firsts) - kill.at if firsts else None


def moving_again(kill: KillSpan, seen_at: Mapping[str, list[float]],
                 ended_at: Mapping[str, float], drained_at: float) -> float | None:
    """Seconds from the kill until every run in flight at it had a new event seen, or
    ended; a run that never did counts until the drain ended. None: no run was in flight."""
    worst: float | None = None
    for run, times in seen_at.items():
        ended = ended_at.get(run)
        if not times or times[0] > kill.at or (ended is not None and ended <= kill.at):
            continue  # not started yet, or over, at the kill
        nxt = _first_after(times, kill.at)
        candidates = [t for t in (nxt, ended) if t is not None]
        moved = (min(candidates) if candidates else drained_at) - kill.at
        worst = moved if worst is None else max(worst, moved)
    return worst
