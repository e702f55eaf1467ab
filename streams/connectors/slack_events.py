"""Slack Events API requests: signature verification and turns, pure.

Slack signs each request: `X-Slack-Signature: v0=<hex HMAC-SHA256(signing secret,
"v0:{X-Slack-Request-Timestamp}:{raw body}")>`; a timestamp more than five
minutes from now is refused as a possible replay.

A turn is a person's message: an `event_callback` whose event is a `message`
(or `app_mention`) without a subtype that changes or hides a message and not
posted by a bot (which includes the connector's own posts). Where it belongs:

* a message in a direct-message channel (`channel_type: im`) outside a thread:
  the whole channel is one Threadline thread, answered in the channel;
* any other message: the chat thread it starts (its own ts) or is a reply in
  (`thread_ts`) is the Threadline thread, answered in that chat thread.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streams.connectors.ids import ChatAddress, message_id_for, tenant_for, thread_id_for

__all__ = ["Turn", "sign", "turn_of", "verify"]

_TURN_EVENTS = frozenset({"message", "app_mention"})
_TURN_SUBTYPES = frozenset({None, "thread_broadcast", "file_share"})
TITLE_CHARS = 80


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 request signature of a body at a timestamp."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify(secret: str, timestamp: str | None, body: bytes, signature: str | None, *,
           now_s: float, window_s: float = 300.0) -> bool:
    """Slack signed `body` at `timestamp`, and `timestamp` is within the window."""
    if not secret or not timestamp or not signature:
        return False
    try:
        fresh = abs(now_s - int(timestamp)) <= window_s
    except ValueError:
        return False
    # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError, so a
    # 500), and a header aiohttp decoded with surrogateescape must not raise either.
    presented = signature.encode("utf-8", "surrogateescape")
    return fresh and hmac.compare_digest(sign(secret, timestamp, body).encode(), presented)


@dataclass(frozen=True, slots=True)
class Turn:
    """A person's chat message, with the Threadline ids it maps to."""

    address: ChatAddress
    thread_id: str
    tenant: str
    message_id: str
    text: str
    title: str
    ts: str
    user: str
    event_id: str


def turn_of(payload: Mapping[str, Any]) -> Turn | None:
    """The turn an `event_callback` carries, or None if it carries none."""
    if payload.get("type") != "event_callback":
        return None
    event = payload.get("event")
    team = payload.get("team_id") or (event or {}).get("team")
    if not isinstance(event, dict) or not isinstance(team, str):
        return None
    if event.get("type") not in _TURN_EVENTS or event.get("subtype") not in _TURN_SUBTYPES:
        return None
    if event.get("bot_id") or event.get("bot_profile"):
        return None
    channel, ts, text = event.get("channel"), event.get("ts"), event.get("text")
    thread_ts = event.get("thread_ts")
    if not (isinstance(channel, str) and isinstance(ts, str) and isinstance(text, str)):
        return None
    if thread_ts is not None and not isinstance(thread_ts, str):
        return None
    try:
        if event.get("channel_type") == "im" and thread_ts is None:
            address = ChatAddress(team, channel, None)
        else:
            address = ChatAddress(team, channel, thread_ts or ts)
        message_id = message_id_for(team, channel, ts)
    except ValueError:  # not Slack's ids: nothing we can answer
        return None
    title = " ".join(text.split())[:TITLE_CHARS] or "(no text)"
    return Turn(address=address, thread_id=thread_id_for(address), tenant=tenant_for(team),
                message_id=message_id, text=text, title=title, ts=ts,
                user=str(event.get("user") or ""), event_id=str(payload.get("event_id") or ""))
