"""Ids derived from the chat: the same chat message always maps to the same ids.

A chat conversation is a Threadline thread whose id *is* its chat address
(`slack:{team}:{channel}` for a direct-message channel, or
`slack:{team}:{channel}:{thread_ts}` for a thread in a channel), and a chat
message is a Threadline message whose id is `slack-message:{team}:{channel}:{ts}`.
So the outbound side needs no lookup table to know where a run's answer goes or
which message it answers, and a redelivered event derives the same ids, which
the processor's duplicate rule turns into one turn.

Outbox ids are opaque uuid5s of the triggering event's id and the role of the
outbound message; they travel in the chat message's metadata and as a webhook's
`Idempotency-Key`; `outbox_id_for` is in `streams.core.ids`, with every other derived id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "ChatAddress",
    "ChatMessageRef",
    "address_of",
    "message_id_for",
    "message_ref_of",
    "tenant_for",
    "thread_id_for",
]

_SLACK_ID = re.compile(r"[A-Z0-9]{1,32}")
_SLACK_TS = re.compile(r"[0-9]{1,12}\.[0-9]{1,8}")


def _valid_id(value: str) -> bool:
    return bool(_SLACK_ID.fullmatch(value))


def _valid_ts(value: str) -> bool:
    return bool(_SLACK_TS.fullmatch(value))


@dataclass(frozen=True, slots=True)
class ChatAddress:
    """Where a Threadline thread lives in the chat: a channel, or a thread in it."""

    team: str
    channel: str
    thread_ts: str | None  # None: the whole channel is the thread (direct messages)

    def __post_init__(self) -> None:
        if not (_valid_id(self.team) and _valid_id(self.channel)):
            raise ValueError(f"not Slack ids: team {self.team!r}, channel {self.channel!r}")
        if self.thread_ts is not None and not _valid_ts(self.thread_ts):
            raise ValueError(f"not a Slack ts: {self.thread_ts!r}")


@dataclass(frozen=True, slots=True)
class ChatMessageRef:
    """A chat message, as named by its Threadline message id."""

    team: str
    channel: str
    ts: str


def thread_id_for(address: ChatAddress) -> str:
    """The thread id of a chat address: `slack:{team}:{channel}`, plus `:{thread_ts}` in a channel."""
    base = f"slack:{address.team}:{address.channel}"
    return base if address.thread_ts is None else f"{base}:{address.thread_ts}"


def address_of(thread_id: str) -> ChatAddress | None:
    """The chat address of a thread id made by `thread_id_for`, else None."""
    parts = thread_id.split(":")
    if parts[0] != "slack" or len(parts) not in (3, 4):
        return None
    try:
        return ChatAddress(parts[1], parts[2], parts[3] if len(parts) == 4 else None)
    except ValueError:
        return None


def tenant_for(team: str) -> str:
    """Each chat workspace is a tenant of its own."""
    return f"slack:{team}"


def message_id_for(team: str, channel: str, ts: str) -> str:
    """The message id `slack-message:{team}:{channel}:{ts}`; ValueError if these are not Slack ids."""
    if not (_valid_id(team) and _valid_id(channel) and _valid_ts(ts)):
        raise ValueError(f"not a Slack message: {team!r} {channel!r} {ts!r}")
    return f"slack-message:{team}:{channel}:{ts}"


def message_ref_of(message_id: str) -> ChatMessageRef | None:
    """The chat message a message id made by `message_id_for` names, else None."""
    parts = message_id.split(":")
    if len(parts) != 4 or parts[0] != "slack-message":
        return None
    _, team, channel, ts = parts
    if not (_valid_id(team) and _valid_id(channel) and _valid_ts(ts)):
        return None
    return ChatMessageRef(team, channel, ts)
