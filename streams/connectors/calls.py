"""What an outbound call came to, and a small blocking HTTP helper for the sinks.

Every call ends in one `Outcome`: `Done` (the effect exists, whether made now or
found already there), `Refused` (it never will: a permanent error), `Retry`
(not now; `maybe_done` when the request may have had its effect, so a post must
be reconciled before it is made again), or `NotSent` (the fence lease ran out
before the request left). Reconciliation ends in `Found` or `NotFound`.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
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
    "http_request",
]

BeforeSend = Callable[[], bool]  # False: the request must not be sent (fence lease over)


@dataclass(frozen=True, slots=True)
class Done:
    result_ts: str | None  # the chat message's ts, for posts and edits
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Refused:
    error: str


@dataclass(frozen=True, slots=True)
class Retry:
    reason: str
    after_s: float | None  # the server's Retry-After, if it said
    maybe_done: bool  # the request may have taken effect
    rate_limited: bool = False


@dataclass(frozen=True, slots=True)
class NotSent:
    reason: str


@dataclass(frozen=True, slots=True)
class Found:
    result_ts: str


@dataclass(frozen=True, slots=True)
class NotFound:
    pass


Outcome = Done | Refused | Retry | NotSent | Found | NotFound


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> dict[str, object]:
        data = json.loads(self.body or b"{}")
        if not isinstance(data, dict):
            raise ValueError("the reply is not a JSON object")
        return data

    def retry_after_s(self) -> float | None:
        raw = self.headers.get("Retry-After")
        try:
            return max(0.0, float(raw)) if raw else None
        except ValueError:
            return None


def _opener(url: str) -> urllib.request.OpenerDirector:
    # A loopback service (tests, a sidecar) is never reached through a proxy.
    host = urllib.parse.urlparse(url).hostname or ""
    if host in ("127.0.0.1", "localhost", "::1"):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def http_request(method: str, url: str, *, body: bytes | None, headers: Mapping[str, str],
                 timeout_s: float, before_send: BeforeSend | None = None
                 ) -> HttpReply | Retry | NotSent:
    """One HTTP exchange. Any status is an `HttpReply`; a transport failure is a
    `Retry` (`maybe_done` unless the connection was refused outright)."""
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    opener = _opener(url)
    if before_send is not None and not before_send():
        return NotSent("the fence lease ran out before the request was sent")
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return HttpReply(response.status, dict(response.headers.items()), response.read())
    except urllib.error.HTTPError as exc:
        try:
            return HttpReply(exc.code, dict(exc.headers.items()), exc.read())
        finally:
            exc.close()
    except urllib.error.URLError as exc:
        refused = isinstance(exc.reason, ConnectionRefusedError)
        return Retry(f"{method} {url}: {exc.reason}", None, maybe_done=not refused)
    except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, broken replies
        return Retry(f"{method} {url}: {type(exc).__name__}: {exc}", None, maybe_done=True)
