"""The outbox of one thread: pure data and pure functions, no I/O.

Every outbound action (a chat post, an edit, a reaction, a webhook POST) is an
`OutboxEntry`, recorded before it is made. `plan` turns a Threadline event into
the entries it causes; the `mark_*` functions move an entry through

    pending --fence--> delivering --call ok--> delivered
                           |  ^                    (or: adopted by reconciliation)
                           +--+ retry              failed (for good)

A `pending` entry was never called; a `delivering` one may have been (its
owner committed the fence and then perhaps called the chat), so whoever finds
it without a result reconciles before calling again.

A thread's entries form two lanes, chat and webhook, each delivered in order,
one call at a time; so an edit always follows the post it edits. The whole
`ChatOutbox` is the value of the compacted outbox topic, keyed by thread id.

The run lifecycle as the chat shows it: when a run is accepted, a placeholder
answer is posted in the thread; when it completes, the placeholder is edited
into the answer (or, if the placeholder is still pending, posted with the
answer directly) and a reaction marks the user's message; a failed or cancelled
run edits the placeholder into a notice; a message refused because a run is
active gets a notice that asks to send it again later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import StrEnum

from streams.connectors.ids import address_of, message_ref_of
from streams.core.domain import (
    Event,
    RejectReason,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunRejected,
)
from streams.core.ids import outbox_id_for

__all__ = [
    "ANSWER",
    "ANSWER_FINAL",
    "NOTICE_CONFLICT",
    "NOTICE_INVALID",
    "PLACEHOLDER_TEXT",
    "REACTION_DONE",
    "REACTION_FAILED",
    "WEBHOOK",
    "ChatOutbox",
    "OutboxEntry",
    "OutboxKind",
    "OutboxStatus",
    "Sinks",
    "coalescable_update",
    "entry",
    "heads",
    "lane",
    "mark_delivered",
    "mark_delivering",
    "mark_failed",
    "plan",
    "prune",
]

# Roles: one outbound message per (trigger, role), so the outbox id names it.
ANSWER = "answer"  # the post that carries a run's answer (first a placeholder)
ANSWER_FINAL = "answer_final"  # the edit that puts the final text in it
REACTION_DONE = "reaction_done"
REACTION_FAILED = "reaction_failed"
NOTICE_CONFLICT = "notice_conflict"
NOTICE_INVALID = "notice_invalid"
WEBHOOK = "webhook"

PLACEHOLDER_TEXT = ":hourglass_flowing_sand: Working on it…"
CONFLICT_TEXT = ("I am still answering your previous message, so I did not take this one. "
                 "Please send it again once that answer is in.")
MAX_CHAT_TEXT = 39_000  # Slack truncates `text` past 40,000 characters
KEEP_DONE = 16  # finished entries kept per thread, newest last
DONE_TEXT_CHARS = 200  # of a finished entry's text (no longer needed), to keep records small


class OutboxKind(StrEnum):
    """What an outbox entry does: a chat post, an edit, a reaction, or a webhook POST."""
    CHAT_POST = "chat_post"
    CHAT_UPDATE = "chat_update"
    CHAT_REACTION = "chat_reaction"
    WEBHOOK_POST = "webhook_post"


class OutboxStatus(StrEnum):
    """Where an outbox entry stands: pending, delivering, delivered or failed."""
    PENDING = "pending"
    DELIVERING = "delivering"
    DELIVERED = "delivered"
    FAILED = "failed"

    @property
    def done(self) -> bool:
        """Whether the entry is finished (delivered or failed)."""
        return self in (OutboxStatus.DELIVERED, OutboxStatus.FAILED)


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One outbound action, recorded before it is made, with its target and delivery state."""
    outbox_id: str
    kind: OutboxKind
    role: str
    trigger: str
    channel: str
    thread_ts: str | None
    target_outbox_id: str | None
    target_ts: str | None
    text: str
    status: OutboxStatus
    attempts: int
    fenced_at_ms: int | None
    result_ts: str | None
    error: str | None
    adopted: bool
    created_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True, slots=True)
class ChatOutbox:
    """The outbox of one thread: its entries, oldest first."""
    thread_id: str
    entries: tuple[OutboxEntry, ...]
    updated_at_ms: int

    def get(self, outbox_id: str) -> OutboxEntry | None:
        """The entry with this id, or None."""
        return next((e for e in self.entries if e.outbox_id == outbox_id), None)


@dataclass(frozen=True, slots=True)
class Sinks:
    """Which outbound sinks are configured: the chat, a webhook, or both."""

    chat: bool
    webhook: bool


def entry(
    trigger: str, role: str, kind: OutboxKind, text: str, now_ms: int, *, channel: str = "",
    thread_ts: str | None = None, target_outbox_id: str | None = None,
    target_ts: str | None = None,
) -> OutboxEntry:
    """A new, pending entry; its id derives from `trigger` and `role`."""
    return OutboxEntry(
        outbox_id=outbox_id_for(trigger, role), kind=kind, role=role, trigger=trigger,
        channel=channel, thread_ts=thread_ts, target_outbox_id=target_outbox_id,
        target_ts=target_ts, text=text, status=OutboxStatus.PENDING, attempts=0,
        fenced_at_ms=None, result_ts=None, error=None, adopted=False,
        created_at_ms=now_ms, updated_at_ms=now_ms,
    )


# --- planning: events in, entries out ------------------------------------------------


def plan(outbox: ChatOutbox | None, event: Event, tenant: str, sinks: Sinks,
         now_ms: int) -> ChatOutbox | None:
    """The outbox after `event` appended the entries it causes; None if it causes none
    (or only entries the outbox already holds: an event seen again changes nothing)."""
    current = outbox or ChatOutbox(event.thread_id, (), now_ms)
    wanted = _chat_entries(current, event, now_ms) if sinks.chat else []
    if sinks.webhook and isinstance(event, RunCompleted):
        wanted.append(entry(event.run_id, WEBHOOK, OutboxKind.WEBHOOK_POST,
                            _webhook_body(event, tenant), now_ms))
    known = {e.outbox_id for e in current.entries}
    new = [e for e in wanted if e.outbox_id not in known]
    if not new:
        return None
    return ChatOutbox(current.thread_id, (*current.entries, *new), now_ms)


def _chat_entries(outbox: ChatOutbox, event: Event, now_ms: int) -> list[OutboxEntry]:
    address = address_of(event.thread_id)
    if address is None:
        return []
    channel, thread_ts = address.channel, address.thread_ts
    if isinstance(event, RunAccepted):
        asked = message_ref_of(event.message_id)
        if asked is None:
            return []
        return [entry(event.run_id, ANSWER, OutboxKind.CHAT_POST, PLACEHOLDER_TEXT, now_ms,
                      channel=channel, thread_ts=thread_ts, target_ts=asked.ts)]
    if isinstance(event, RunRejected):
        asked = message_ref_of(event.message_id)
        if asked is None:
            return []
        if event.reason is RejectReason.CONFLICT:
            role, text = NOTICE_CONFLICT, CONFLICT_TEXT
        elif event.reason is RejectReason.INVALID:
            role, text = NOTICE_INVALID, f"I could not take this message: {event.detail}."
        else:  # a duplicate is a redelivery: it was answered (or is being answered) already
            return []
        return [entry(event.message_id, role, OutboxKind.CHAT_POST, text, now_ms,
                      channel=channel, thread_ts=thread_ts)]
    if isinstance(event, RunCompleted):
        return _run_ended(outbox, event.run_id, _chat_text(event.message.text),
                          REACTION_DONE, "white_check_mark", channel, thread_ts, now_ms)
    if isinstance(event, RunFailed):
        text = f":warning: Sorry, I could not answer this one ({event.error})."
        return _run_ended(outbox, event.run_id, text, REACTION_FAILED, "x", channel,
                          thread_ts, now_ms)
    if isinstance(event, RunCancelled):
        return _run_ended(outbox, event.run_id, f"_Cancelled: {event.reason or 'no reason'}._",
                          None, "", channel, thread_ts, now_ms)
    return []


def _run_ended(outbox: ChatOutbox, run_id: str, text: str, reaction_role: str | None,
               reaction: str, channel: str, thread_ts: str | None,
               now_ms: int) -> list[OutboxEntry]:
    placeholder = outbox.get(outbox_id_for(run_id, ANSWER))
    if placeholder is None:  # the run began before the chat knew of it: post the text
        return [entry(run_id, ANSWER, OutboxKind.CHAT_POST, text, now_ms, channel=channel,
                      thread_ts=thread_ts)]
    planned = [entry(run_id, ANSWER_FINAL, OutboxKind.CHAT_UPDATE, text, now_ms,
                     channel=channel, target_outbox_id=placeholder.outbox_id)]
    if reaction_role is not None and placeholder.target_ts is not None:
        planned.append(entry(run_id, reaction_role, OutboxKind.CHAT_REACTION, reaction, now_ms,
                             channel=channel, target_ts=placeholder.target_ts))
    return planned


def _chat_text(text: str) -> str:
    if len(text) <= MAX_CHAT_TEXT:
        return text
    return text[:MAX_CHAT_TEXT] + " … (truncated)"


def _webhook_body(event: RunCompleted, tenant: str) -> str:
    body = {
        "type": "run.completed", "thread_id": event.thread_id, "tenant": tenant,
        "run_id": event.run_id, "attempt": event.attempt, "completed_at_ms": event.at_ms,
        "message": {
            "message_id": event.message.message_id, "text": event.message.text,
            "citations": [{"url": c.url, "title": c.title} for c in event.message.citations],
        },
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- delivery order ------------------------------------------------------------------


def lane(e: OutboxEntry) -> str:
    """The lane an entry is delivered in, in order: webhook POSTs apart from chat calls."""
    return "webhook" if e.kind is OutboxKind.WEBHOOK_POST else "chat"


def heads(outbox: ChatOutbox) -> list[OutboxEntry]:
    """The next entry to deliver in each lane: the oldest one not done."""
    found: dict[str, OutboxEntry] = {}
    for e in outbox.entries:
        if not e.status.done:
            found.setdefault(lane(e), e)
    return list(found.values())


def coalescable_update(outbox: ChatOutbox, post: OutboxEntry) -> OutboxEntry | None:
    """A pending edit of `post` already planned: then post its text at once."""
    if post.kind is not OutboxKind.CHAT_POST or post.status is not OutboxStatus.PENDING:
        return None
    return next((e for e in outbox.entries if e.kind is OutboxKind.CHAT_UPDATE
                 and e.target_outbox_id == post.outbox_id
                 and e.status is OutboxStatus.PENDING), None)


# --- transitions -------------------------------------------------------------------------


def _change(outbox: ChatOutbox, outbox_id: str, now_ms: int, **changes: object) -> ChatOutbox:
    entries = tuple(
        replace(e, updated_at_ms=now_ms, **changes) if e.outbox_id == outbox_id else e  # type: ignore[arg-type]
        for e in outbox.entries
    )
    return ChatOutbox(outbox.thread_id, entries, now_ms)


def mark_delivering(outbox: ChatOutbox, outbox_id: str, now_ms: int) -> ChatOutbox:
    """The fence: the entry is about to be called (once more)."""
    current = outbox.get(outbox_id)
    attempts = current.attempts + 1 if current else 1
    return _change(outbox, outbox_id, now_ms, status=OutboxStatus.DELIVERING,
                   attempts=attempts, fenced_at_ms=now_ms)


def mark_delivered(outbox: ChatOutbox, outbox_id: str, result_ts: str | None, adopted: bool,
                   now_ms: int) -> ChatOutbox:
    """The outbox with this entry marked delivered (or adopted), its text trimmed."""
    current = outbox.get(outbox_id)
    if current is None or current.status.done:
        return outbox
    return prune(_change(outbox, outbox_id, now_ms, status=OutboxStatus.DELIVERED,
                         result_ts=result_ts, adopted=adopted, error=None,
                         text=current.text[:DONE_TEXT_CHARS]))


def mark_failed(outbox: ChatOutbox, outbox_id: str, error: str, now_ms: int) -> ChatOutbox:
    """The outbox with this entry marked failed with an error, its text trimmed."""
    current = outbox.get(outbox_id)
    if current is None or current.status.done:
        return outbox
    return prune(_change(outbox, outbox_id, now_ms, status=OutboxStatus.FAILED, error=error,
                         text=current.text[:DONE_TEXT_CHARS]))


def _is_placeholder(e: OutboxEntry) -> bool:
    # A run's answer post made when the run was accepted: it names the message it answers.
    return e.role == ANSWER and e.target_ts is not None


def prune(outbox: ChatOutbox, keep: int = KEEP_DONE) -> ChatOutbox:
    """Drop the oldest finished entries past `keep`, but never one that is still
    needed: the post an unfinished edit targets, or a placeholder whose run has
    not ended yet (its edit is still to be planned)."""
    done = [e for e in outbox.entries if e.status.done]
    if len(done) <= keep:
        return outbox
    needed = {e.target_outbox_id for e in outbox.entries if not e.status.done}
    edited = {e.target_outbox_id for e in outbox.entries if e.role == ANSWER_FINAL}
    needed |= {e.outbox_id for e in done if _is_placeholder(e) and e.outbox_id not in edited}
    droppable = [e.outbox_id for e in done if e.outbox_id not in needed]
    drop = set(droppable[: len(done) - keep])
    return replace(outbox, entries=tuple(e for e in outbox.entries if e.outbox_id not in drop))
