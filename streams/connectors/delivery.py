"""Making the calls: which entry goes next, the call itself, and what its outcome
does to the outbox. Kafka is `relay`'s business; this module never touches it.

What this process knows of an entry beyond its record lives in `_Runtime`: when
it may be tried again, and whether it must be reconciled first. A chat post that
was `delivering` when this process took the thread over, or whose call may have
had its effect (a timeout, a 5xx), is reconciled before it is called again: the
chat's history is read back and a message whose metadata carries the outbox id
is adopted. Edits, reactions and webhooks are idempotent and simply called again.

Calls run on a small thread pool. Each was fenced by the transaction that marked
it `delivering` (monotonic time `fence_mono`); it is sent only while that fence
is younger than the lease, checked the moment before the request leaves.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from streams.connectors.calls import Done, Found, NotFound, NotSent, Outcome, Refused, Retry
from streams.connectors.config import ConnectorConfig
from streams.connectors.outbox import (
    ChatOutbox,
    OutboxEntry,
    OutboxKind,
    OutboxStatus,
    coalescable_update,
    heads,
    mark_delivered,
    mark_delivering,
    mark_failed,
)
from streams.connectors.slack_api import SlackApi
from streams.connectors.stats import ConnectorStats
from streams.connectors.webhook import WebhookSink

__all__ = ["CRASH_EXIT_STATUS", "Calls", "Job"]

log = logging.getLogger("threadline.connector.delivery")

CRASH_EXIT_STATUS = 137
RECONCILE_LOOKBACK_S = 300.0  # chat clock vs connector clock, when reading history back
CHAT_BACKOFF_MAX_S = 60.0


@dataclass
class _Runtime:
    needs_reconcile: bool = False
    not_before: float = 0.0  # monotonic
    failures: int = 0


@dataclass(frozen=True, slots=True)
class Job:
    """One call (or one reconciliation) of one entry, and where its thread lives."""

    partition: int
    key: bytes
    entry: OutboxEntry
    text: str  # what is posted: the entry's text, or a coalesced edit's
    target_ts: str | None
    coalesced_id: str | None  # an edit delivered by this post too
    reconcile: bool
    fence_mono: float


class Calls:
    """Runs outbox calls on a thread pool, at most `concurrency` at once, with per-method rate limits."""
    def __init__(self, config: ConnectorConfig, stats: ConnectorStats, chat: SlackApi | None,
                 webhook: WebhookSink | None) -> None:
        self.config, self.stats, self.chat, self.webhook = config, stats, chat, webhook
        self.pool = ThreadPoolExecutor(max(1, config.concurrency), thread_name_prefix="call")
        self.in_flight: dict[str, tuple[Job, Future[Outcome]]] = {}
        self.runtime: dict[str, _Runtime] = {}
        self.kind_not_before: dict[OutboxKind, float] = {}  # rate limits, per API method
        self.stale_reconciles: set[str] = set()
        self.reserved = 0  # calls fenced in this step, not launched yet
        self.random = random.Random()

    # --- choosing -------------------------------------------------------------------------

    def restored(self, outbox: ChatOutbox) -> None:
        """A thread this process just took over: a post that may have been made
        by its previous owner is reconciled before anything else."""
        for e in outbox.entries:
            if not e.status.done:
                self.runtime[e.outbox_id] = _Runtime(
                    needs_reconcile=e.kind is OutboxKind.CHAT_POST
                    and e.status is OutboxStatus.DELIVERING)
                in_flight = self.in_flight.get(e.outbox_id)
                if in_flight is not None and in_flight[0].reconcile:
                    # Read before the thread moved away and back: another owner may
                    # have posted since, so "not found" no longer means anything.
                    self.stale_reconciles.add(e.outbox_id)

    def begin_step(self) -> None:
        """A new step: the calls fenced in the last one are launched or dropped by now."""
        self.reserved = 0

    def free_slots(self) -> int:
        """How many more calls may start now."""
        return self.config.concurrency - len(self.in_flight) - self.reserved

    def choose(self, partition: int, key: bytes, outbox: ChatOutbox, now_ms: int,
               fence: Callable[[Job], None]) -> ChatOutbox:
        """Pick the next call of each lane of a thread. Entries to call are marked
        `delivering` in the returned outbox and handed to `fence` (launched once
        the fence transaction commits); reconciliations are launched at once."""
        mono = time.monotonic()
        for head in heads(outbox):
            if head.outbox_id in self.in_flight or self.free_slots() <= 0:
                continue
            rt = self.runtime.setdefault(head.outbox_id, _Runtime())
            if rt.not_before > mono or self.kind_not_before.get(head.kind, 0.0) > mono:
                continue
            target_ts = head.target_ts
            if head.kind is OutboxKind.CHAT_UPDATE:
                target = outbox.get(head.target_outbox_id or "")
                if target is None or target.status is OutboxStatus.FAILED:
                    outbox = mark_failed(outbox, head.outbox_id, "the post it edits was not made", now_ms)
                    continue
                if target.status is not OutboxStatus.DELIVERED:
                    continue
                target_ts = target.result_ts
            if (head.kind is OutboxKind.WEBHOOK_POST
                    and head.attempts >= self.config.webhook_max_attempts):
                outbox = mark_failed(outbox, head.outbox_id,
                                     f"gave up after {head.attempts} attempts", now_ms)
                self.stats.add("refused")
                continue
            if rt.needs_reconcile:
                lease_end_ms = (head.fenced_at_ms or 0) + int(
                    (self.config.lease_s + self.config.clock_margin_s) * 1000)
                if now_ms < lease_end_ms:  # its previous caller may still be about to call
                    rt.not_before = mono + (lease_end_ms - now_ms) / 1000
                    continue
                self._launch(Job(partition, key, head, head.text, None, None, True, mono))
                continue
            coalesced = coalescable_update(outbox, head)
            text = coalesced.text if coalesced is not None else head.text
            outbox = mark_delivering(outbox, head.outbox_id, now_ms)
            self.reserved += 1
            fence(Job(partition, key, head, text, target_ts,
                      coalesced.outbox_id if coalesced else None, False, mono))
        return outbox

    # --- calling ----------------------------------------------------------------------------

    def launch(self, job: Job) -> None:
        """Start a call whose fence committed; its lease runs from `job.fence_mono`,
        taken before the fence transaction began."""
        self._launch(job)

    def _launch(self, job: Job) -> None:
        self.in_flight[job.entry.outbox_id] = (job, self.pool.submit(self._execute, job))

    def _execute(self, job: Job) -> Outcome:
        e = job.entry
        try:
            outcome = self._call(job)
        except Exception as exc:  # a bug or an unexpected reply: as if it may have happened
            log.exception("call for %s broke", e.outbox_id)
            return Retry(f"{type(exc).__name__}: {exc}", None, maybe_done=True)
        if isinstance(outcome, Done) and self._crash_now(e):
            # Test switch: die between the call and its record, as a crash would.
            log.warning("crash switch: exiting after the %s call for %s", e.kind.value, e.outbox_id)
            os._exit(CRASH_EXIT_STATUS)
        return outcome

    def _call(self, job: Job) -> Outcome:
        e, chat, lease_s = job.entry, self.chat, self.config.lease_s

        def before_send() -> bool:
            return time.monotonic() - job.fence_mono < lease_s

        if e.kind is OutboxKind.WEBHOOK_POST:
            if self.webhook is None:
                return Refused("no webhook is configured")
            return self.webhook.post(job.text, e.outbox_id, before_send)
        if chat is None:
            return Refused("no chat bot token is configured")
        if job.reconcile:
            return chat.find_outbox_message(e.channel, e.thread_ts, e.outbox_id,
                                            e.created_at_ms / 1000 - RECONCILE_LOOKBACK_S)
        if e.kind is OutboxKind.CHAT_POST:
            return chat.post_message(e.channel, job.text, e.thread_ts, e.outbox_id, before_send)
        if e.kind is OutboxKind.CHAT_UPDATE:
            return chat.update(e.channel, job.target_ts or "", job.text, e.outbox_id, before_send)
        return chat.add_reaction(e.channel, job.target_ts or "", job.text, before_send)

    def _crash_now(self, e: OutboxEntry) -> bool:
        config = self.config
        if config.crash_after_call <= 0 or (config.crash_kinds and e.kind.value not in config.crash_kinds):
            return False
        return self.random.random() < config.crash_after_call

    def finished(self) -> list[tuple[Job, Outcome]]:
        """The calls that have ended since the last look, with their outcomes."""
        done = [(oid, jf) for oid, jf in self.in_flight.items() if jf[1].done()]
        results = []
        for outbox_id, (job, future) in done:
            del self.in_flight[outbox_id]
            results.append((job, future.result()))
        return results

    # --- outcomes --------------------------------------------------------------------------

    def note(self, job: Job, outcome: Outcome) -> None:
        """Take in a finished call once: count it, and set when its entry may go next."""
        e = job.entry
        rt = self.runtime.setdefault(e.outbox_id, _Runtime())
        match outcome:
            case Done():
                self.stats.add("delivered")
            case Found():
                self.stats.add("adopted")
            case NotFound():
                self.stats.add("reconciled_not_found")
                rt.needs_reconcile = e.outbox_id in self.stale_reconciles
            case Refused(error=error):
                self.stats.add("refused")
                log.warning("%s %s failed for good: %s", e.kind.value, e.outbox_id, error)
            case NotSent():
                self.stats.add("not_sent")
            case Retry():
                self._retry(e, rt, outcome)
        if job.reconcile:
            self.stale_reconciles.discard(e.outbox_id)
        if isinstance(outcome, Done | Found | Refused):
            self.runtime.pop(e.outbox_id, None)
            if job.coalesced_id is not None:
                self.runtime.pop(job.coalesced_id, None)

    @staticmethod
    def record(outbox: ChatOutbox, job: Job, outcome: Outcome, now_ms: int) -> ChatOutbox:
        """The outbox with `outcome` recorded (unchanged if there is nothing to record)."""
        e = job.entry
        match outcome:
            case Done(result_ts=ts):
                outbox = mark_delivered(outbox, e.outbox_id, ts, False, now_ms)
                if job.coalesced_id is not None:
                    outbox = mark_delivered(outbox, job.coalesced_id, ts, False, now_ms)
            case Found(result_ts=ts):
                outbox = mark_delivered(outbox, e.outbox_id, ts, True, now_ms)
            case Refused(error=error):
                outbox = mark_failed(outbox, e.outbox_id, error, now_ms)
        return outbox

    def forget(self, outbox: ChatOutbox) -> None:
        """A thread this process no longer owns."""
        for e in outbox.entries:
            self.runtime.pop(e.outbox_id, None)

    def _retry(self, e: OutboxEntry, rt: _Runtime, outcome: Retry) -> None:
        self.stats.add("retries")
        rt.failures += 1
        if outcome.maybe_done and e.kind is OutboxKind.CHAT_POST:
            rt.needs_reconcile = True
        if e.kind is OutboxKind.WEBHOOK_POST:
            backoff = _backoff(self.config.webhook_backoff_s, self.config.webhook_backoff_max_s,
                               rt.failures)
        else:
            backoff = _backoff(1.0, CHAT_BACKOFF_MAX_S, rt.failures)
        delay = backoff if outcome.after_s is None else min(outcome.after_s,
                                                            self.config.retry_after_max_s)
        rt.not_before = time.monotonic() + delay
        if outcome.rate_limited:
            self.stats.add("rate_limited")
            if e.kind is not OutboxKind.WEBHOOK_POST:
                self.kind_not_before[e.kind] = rt.not_before
        log.info("%s %s: %s; again in %.1fs", e.kind.value, e.outbox_id, outcome.reason, delay)

    def close(self) -> None:
        """Stop the pool (dropping queued calls) and close the chat and webhook clients."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        for sink in (self.chat, self.webhook):
            if sink is not None:
                sink.close()


def _backoff(initial_s: float, max_s: float, failures: int) -> float:
    """initial * 2^(failures - 1), at most max_s; the chat lane retries without end,
    and 2.0 ** 1024 overflows a float, so the exponent stops growing first."""
    return min(initial_s * 2.0 ** min(max(failures - 1, 0), 64), max_s)
