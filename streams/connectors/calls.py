"""What an outbound call came to (the HTTP client is `http_client`).

Every call ends in one `Outcome`: `Done` (the effect exists, whether made now or
found already there), `Refused` (it never will: a permanent error), `Retry`
(not now; `maybe_done` when the request may have had its effect, so a post must
be reconciled before it is made again), or `NotSent` (the fence lease ran out
before the request left). Reconciliation ends in `Found` or `NotFound`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "BeforeSend",
    "Done",
    "Found",
    "HttpReply",
    "NotFound",
    "NotSent",
    "Outcome",
    "Refused",
    "Retry",
]

BeforeSend = Callable[[], bool]  # False: the request must not be sent (fence lease over)


@dataclass(frozen=True, slots=True)
class Done:
    """Outcome: the call's effect exists, made now or found already there."""
    result_ts: str | None  # the chat message's ts, for posts and edits
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Refused:
    """Outcome: a permanent error; the call will never succeed."""
    error: str


@dataclass(frozen=True, slots=True)
class Retry:
    """Outcome: not now; try again later (reconcile first if it may have taken effect)."""
    reason: str
    after_s: float | None  # the server's Retry-After, if it said
    maybe_done: bool  # the request may have taken effect
    rate_limited: bool = False


@dataclass(frozen=True, slots=True)
class NotSent:
    """Outcome: the fence lease ran out before the request left."""
    reason: str


@dataclass(frozen=True, slots=True)
class Found:
    """Reconciliation outcome: the post already exists, at this message ts."""
    result_ts: str


@dataclass(frozen=True, slots=True)
class NotFound:
    """Reconciliation outcome: the post was never made."""
    pass


Outcome = Done | Refused | Retry | NotSent | Found | NotFound


@dataclass(frozen=True, slots=True)
class HttpReply:
    """An HTTP response: status, headers and body."""
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> dict[str, object]:
        """The body parsed as a JSON object (ValueError if it is not one)."""
        data = json.loads(self.body or b"{}")
        if not isinstance(data, dict):
            raise ValueError("the reply is not a JSON object")
        return data

    def retry_after_s(self) -> float | None:
        """The server's delay in seconds, if it gave a finite one (the caller caps it)."""
        raw = self.headers.get("Retry-After")
        try:
            seconds = float(raw) if raw else None
        except ValueError:
            return None
        return max(0.0, seconds) if seconds is not None and math.isfinite(seconds) else None

    @property
    def redirect(self) -> bool:
        """Whether the status is a 3xx redirect."""
        return 300 <= self.status < 400
