"""The subset of Slack's Web API the connector calls, blocking, one call at a time.

    chat.postMessage        post, carrying `metadata` {event_type: threadline_outbox,
                            event_payload: {outbox_id}} so the post can be found again
    chat.update             edit (idempotent: the same text twice is one edit)
    reactions.add           react (`already_reacted` counts as done)
    conversations.replies   \\ read back with `include_all_metadata=true` to find a
    conversations.history   / post made before a crash (reconciliation)

Rate limits are HTTP 429 with `Retry-After` (seconds), per method. A redirect
is never followed (it would carry the bot token elsewhere): the call is refused.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from streams.connectors.calls import (
    BeforeSend,
    Done,
    Found,
    HttpReply,
    NotFound,
    NotSent,
    Outcome,
    Refused,
    Retry,
)
from streams.connectors.http_client import HttpClient

__all__ = ["METADATA_EVENT_TYPE", "SlackApi", "outbox_id_in"]

METADATA_EVENT_TYPE = "threadline_outbox"
HISTORY_PAGES = 10  # pages of 200 messages read back when reconciling
# ok=false errors that say nothing was done, or may have been, but that a later call can fix.
_TRANSIENT = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable",
                        "request_timeout", "team_added_to_org"})


def outbox_id_in(message: dict[str, Any]) -> str | None:
    """The outbox id in a message's metadata, if the connector posted it."""
    metadata = message.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("event_type") != METADATA_EVENT_TYPE:
        return None
    payload = metadata.get("event_payload")
    value = payload.get("outbox_id") if isinstance(payload, dict) else None
    return value if isinstance(value, str) else None


class SlackApi:
    """The few Slack Web API methods the connector calls: post, edit, react."""
    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0,
                 http: HttpClient | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.http = http or HttpClient()

    def close(self) -> None:
        """Close the HTTP client's connections."""
        self.http.close()

    # --- writes -------------------------------------------------------------------

    def post_message(self, channel: str, text: str, thread_ts: str | None, outbox_id: str,
                     before_send: BeforeSend | None = None) -> Outcome:
        """Post a message (in a thread if thread_ts), tagged with its outbox id for reconciliation."""
        body: dict[str, Any] = {"channel": channel, "text": text, "unfurl_links": False,
                                "metadata": _metadata(outbox_id)}
        if thread_ts is not None:
            body["thread_ts"] = thread_ts
        reply = self._write("chat.postMessage", body, before_send)
        if isinstance(reply, dict):
            return Done(str(reply.get("ts") or ""), "posted")
        return reply

    def update(self, channel: str, ts: str, text: str, outbox_id: str,
               before_send: BeforeSend | None = None) -> Outcome:
        """Replace a posted message's text."""
        body = {"channel": channel, "ts": ts, "text": text, "metadata": _metadata(outbox_id)}
        reply = self._write("chat.update", body, before_send)
        if isinstance(reply, dict):
            return Done(str(reply.get("ts") or ts), "updated")
        return reply

    def add_reaction(self, channel: str, ts: str, name: str,
                     before_send: BeforeSend | None = None) -> Outcome:
        """Add an emoji reaction to a message; already reacted counts as done."""
        reply = self._write("reactions.add", {"channel": channel, "timestamp": ts, "name": name},
                            before_send, done_errors=("already_reacted",))
        if isinstance(reply, dict):
            return Done(None, str(reply.get("detail") or "reacted"))
        return reply

    # --- reads: reconciliation ---------------------------------------------------------

    def find_outbox_message(self, channel: str, thread_ts: str | None, outbox_id: str,
                            oldest_s: float) -> Outcome:
        """`Found` with the ts of the message carrying `outbox_id`, else `NotFound`;
        `Retry` or `Refused` if the history could not be read (or not far enough)."""
        method = "conversations.replies" if thread_ts is not None else "conversations.history"
        params = {"channel": channel, "include_all_metadata": "true", "limit": "200",
                  "oldest": f"{max(oldest_s, 0):.6f}", "inclusive": "true"}
        if thread_ts is not None:
            params["ts"] = thread_ts
        cursor = ""
        for _ in range(HISTORY_PAGES):
            query = urllib.parse.urlencode({**params, **({"cursor": cursor} if cursor else {})})
            reply = self.http.request("GET", f"{self.base_url}/{method}?{query}", body=None,
                                      headers=self._headers(), timeout_s=self.timeout_s)
            page = self._result(method, reply, maybe_done=False, done_errors=("thread_not_found",))
            if not isinstance(page, dict):
                return page
            if page.get("detail") == "thread_not_found":  # no thread: nothing was posted in it
                return NotFound()
            for message in page.get("messages") or []:
                if isinstance(message, dict) and outbox_id_in(message) == outbox_id:
                    return Found(str(message.get("ts")))
            metadata = page.get("response_metadata")
            cursor = metadata.get("next_cursor", "") if isinstance(metadata, dict) else ""
            if not cursor:
                return NotFound()
        # Not found in the pages read, and more there: calling again could post a duplicate.
        return Refused(f"{method}: could not reconcile, more than {HISTORY_PAGES} pages of history")

    # --- plumbing ----------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json; charset=utf-8"}

    def _write(self, method: str, body: dict[str, Any], before_send: BeforeSend | None,
               done_errors: tuple[str, ...] = ()) -> dict[str, Any] | Outcome:
        reply = self.http.request("POST", f"{self.base_url}/{method}",
                                  body=json.dumps(body).encode(), headers=self._headers(),
                                  timeout_s=self.timeout_s, before_send=before_send)
        return self._result(method, reply, maybe_done=True, done_errors=done_errors)

    @staticmethod
    def _result(method: str, reply: HttpReply | Retry | NotSent, *, maybe_done: bool,
                done_errors: tuple[str, ...] = ()) -> dict[str, Any] | Outcome:
        if not isinstance(reply, HttpReply):
            return reply
        if reply.redirect:
            return Refused(f"{method}: HTTP {reply.status} to {reply.headers.get('Location', '?')}, "
                           "not followed")
        if reply.status == 429:
            return Retry(f"{method}: rate limited", reply.retry_after_s() or 1.0,
                         maybe_done=False, rate_limited=True)
        if reply.status >= 500:
            return Retry(f"{method}: HTTP {reply.status}", reply.retry_after_s(), maybe_done)
        try:
            data = reply.json()
        except ValueError:
            return Retry(f"{method}: HTTP {reply.status}, not JSON", None, maybe_done)
        if reply.status != 200:
            return Refused(f"{method}: HTTP {reply.status}: {data.get('error', '')}")
        if data.get("ok") is True:
            return data
        error = str(data.get("error") or "unknown_error")
        if error in done_errors:
            return {"ok": True, "detail": error}
        if error in _TRANSIENT:
            return Retry(f"{method}: {error}", reply.retry_after_s(), maybe_done)
        return Refused(f"{method}: {error}")


def _metadata(outbox_id: str) -> dict[str, Any]:
    return {"event_type": METADATA_EVENT_TYPE, "event_payload": {"outbox_id": outbox_id}}
