"""Turns end to end: the chat double, the real broker, and real role processes
(processor, worker, connector) sharing one stack; nothing is killed here."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from streams.connectors.audit import AuditKind
from streams.connectors.outbox import ANSWER, PLACEHOLDER_TEXT, WEBHOOK, OutboxStatus
from streams.connectors.topics import audit_topic
from streams.connectors.webhook import verify
from streams.core.domain import Event, RejectReason, RunAccepted, RunFailed, RunRejected
from streams.core.ids import outbox_id_for
from streams.wire.connector import decode_audit
from tests.connectors.chat_double import ChatDouble
from tests.connectors.stack import (
    Stack,
    accepted_runs,
    completed,
    run_of,
    running_stack,
    thread_of,
    unique_channel,
    wait_until,
)
from tests.connectors.webhook_receiver import WebhookReceiver
from tests.kafka_helpers import read_topic

pytestmark = pytest.mark.kafka

WEBHOOK_SECRET = "hook-secret"


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    """A webhook receiver that fails each key's first two requests, for this module."""
    hook = WebhookReceiver(fail_first=2).start()
    yield hook
    hook.stop()


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory,
          receiver: WebhookReceiver) -> Iterator[Stack]:
    """A connector stack with a rate-limiting chat double and the webhook, for this module."""
    tmp = tmp_path_factory.mktemp("connector-turns")
    double = ChatDouble(rate_limit_every=4)  # every 4th post or history read: 429
    with running_stack(kafka_bootstrap, tmp, double=double,
                       THREADLINE_AGENT_SLOW_TOKENS_PER_S="3") as running:
        running.start_connector("c1", THREADLINE_WEBHOOK_URL=receiver.url,
                                THREADLINE_WEBHOOK_SECRET=WEBHOOK_SECRET,
                                THREADLINE_WEBHOOK_BACKOFF_S="0.2")
        yield running


def _answered(stack: Stack, channel: str, run: str, text: str) -> None:
    answer_id = outbox_id_for(run, ANSWER)

    def done() -> bool:
        return any(p.outbox_id == answer_id and p.text.startswith(text)
                   for p in stack.double.bot_posts(channel))

    wait_until(done, 30, f"the answer of {run}", stack)


def test_a_signed_message_is_answered_by_exactly_one_reply_with_outbox_metadata(stack: Stack) -> None:
    """A signed chat message is answered by one reply in its thread, tagged with its outbox id."""
    channel = unique_channel()
    payload, statuses = stack.say("c1", channel, "hello there")
    assert statuses == [200]
    thread = thread_of(payload)
    run = run_of(payload, thread)
    stack.events(completed({run}))
    _answered(stack, channel, run, "You said: hello there.")
    posts = stack.double.bot_posts(channel)
    assert [p.outbox_id for p in posts] == [outbox_id_for(run, ANSWER)]
    (post,) = posts
    assert post.thread_ts == payload["event"]["ts"]  # answered in the chat thread it started
    assert post.text != PLACEHOLDER_TEXT
    user_message = stack.double.message(channel, payload["event"]["ts"])
    assert user_message is not None
    wait_until(lambda: "white_check_mark" in user_message.reactions, 10, "the reaction", stack)
    # The authorizing audit record was written for the inbound event.
    audits = read_topic(stack.settings, audit_topic(stack.settings), decode_audit,
                        until=lambda a: any(x.thread_id == thread for x in a), timeout=10)
    inbound = [a for a in audits if a.thread_id == thread and a.kind is AuditKind.INBOUND_EVENT]
    assert len(inbound) == 1 and json.loads(inbound[0].detail_json)["ts"] == payload["event"]["ts"]


def test_redeliveries_of_one_event_make_one_turn(stack: Stack) -> None:
    """Slack's redeliveries of one event, even concurrent, make one turn."""
    channel = unique_channel()
    payload = stack.double.user_message(channel, "say it once")
    results: list[int] = []
    senders = [threading.Thread(target=lambda n=n: results.append(
        stack.double.send(stack.url("c1"), payload, retry_num=n or None)[0])) for n in range(3)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    assert results == [200, 200, 200]
    assert stack.double.send(stack.url("c1"), payload, retry_num=3)[0] == 200  # and a late one
    thread = thread_of(payload)
    run = run_of(payload, thread)
    _answered(stack, channel, run, "You said: say it once.")

    def three_duplicates(events: list[Event]) -> bool:
        return sum(isinstance(e, RunRejected) and e.thread_id == thread for e in events) >= 3

    events = [e for e in stack.events(three_duplicates, timeout=20) if e.thread_id == thread]
    assert accepted_runs(events) == [run]
    assert {e.reason for e in events if isinstance(e, RunRejected)} == {RejectReason.DUPLICATE}
    marker = stack.marker_turn("c1", channel, thread_ts=payload["event"]["ts"])
    assert [p.outbox_id for p in stack.double.bot_posts(channel)] == [
        outbox_id_for(run, ANSWER), outbox_id_for(marker, ANSWER)], "a duplicate answer before the marker"


def test_a_message_while_a_run_is_active_gets_a_notice_and_no_run(stack: Stack) -> None:
    """A chat reply while the thread's run is active gets a conflict notice and no run."""
    channel = unique_channel()
    first, statuses = stack.say("c1", channel, "[slow] take your time")
    assert statuses == [200]
    root = first["event"]["ts"]
    second, statuses = stack.say("c1", channel, "and another thing", thread_ts=root)
    assert statuses == [200]
    thread = thread_of(first)
    assert thread_of(second) == thread  # a reply in the chat thread is the same Threadline thread
    run = run_of(first, thread)
    stack.events(completed({run}))
    _answered(stack, channel, run, "You said: [slow] take your time.")
    notice_id = outbox_id_for(f"slack-message:T0TEST:{channel}:{second['event']['ts']}",
                              "notice_conflict")
    wait_until(lambda: any(p.outbox_id == notice_id for p in stack.double.bot_posts(channel)),
               20, "the conflict notice", stack)
    events = [e for e in stack.events(completed({run})) if e.thread_id == thread]
    assert accepted_runs(events) == [run]
    assert [e.reason for e in events if isinstance(e, RunRejected)] == [RejectReason.CONFLICT]
    posts = stack.double.bot_posts(channel)
    assert sorted(p.outbox_id or "" for p in posts) == sorted([outbox_id_for(run, ANSWER), notice_id])
    assert all(p.thread_ts == root for p in posts)


def test_a_failed_run_turns_the_placeholder_into_a_notice(stack: Stack) -> None:
    """A failed run's placeholder becomes a failure notice, with an x reaction."""
    channel = unique_channel()
    payload, _ = stack.say("c1", channel, "[fail-fatal] please")
    thread = thread_of(payload)
    run = run_of(payload, thread)
    stack.events(lambda es: any(isinstance(e, RunFailed) and e.run_id == run for e in es))
    _answered(stack, channel, run, ":warning: Sorry, I could not answer")
    user_message = stack.double.message(channel, payload["event"]["ts"])
    assert user_message is not None
    wait_until(lambda: "x" in user_message.reactions, 10, "the failure reaction", stack)
    assert len(stack.double.bot_posts(channel)) == 1


def test_a_direct_message_is_answered_in_the_channel_itself(stack: Stack) -> None:
    """A direct message is answered in the conversation, not in a thread."""
    channel = "D" + unique_channel()[1:]
    first, _ = stack.say("c1", channel, "hi in private", channel_type="im")
    thread = thread_of({"event": {**first["event"], "ts": ""}}).rstrip(":")
    assert thread == f"slack:T0TEST:{channel}"
    run = run_of(first, thread)
    _answered(stack, channel, run, "You said: hi in private.")
    (post,) = stack.double.bot_posts(channel)
    assert post.thread_ts is None


def test_many_turns_through_rate_limits_are_each_answered_once(stack: Stack) -> None:
    """Turns answered through 429s from the chat are each posted exactly once."""
    limited_before = stack.double.status_count(429)
    turns = []
    for n in range(6):
        channel = unique_channel()
        payload, statuses = stack.say("c1", channel, f"turn {n}")
        assert statuses == [200]
        turns.append((channel, run_of(payload, thread_of(payload)), n))
    for channel, run, n in turns:
        _answered(stack, channel, run, f"You said: turn {n}.")
    assert stack.double.status_count(429) > limited_before, "the double never rate limited"
    for channel, run, _ in turns:
        assert [p.outbox_id for p in stack.double.bot_posts(channel)] == [outbox_id_for(run, ANSWER)]
    stats = stack.stats("c1")
    assert stats is not None and stats["rate_limited"] > 0


def test_a_post_the_chat_refuses_fails_for_good_without_retrying(stack: Stack) -> None:
    """A post the chat refuses is marked failed and not retried."""
    channel = "CGONE" + unique_channel()[5:]
    payload, _ = stack.say("c1", channel, "anyone?")
    thread = thread_of(payload)
    run = run_of(payload, thread)
    stack.events(completed({run}))

    def failed() -> bool:
        outbox = stack.outboxes().get(thread)
        entry = outbox.get(outbox_id_for(run, ANSWER)) if outbox else None
        return entry is not None and entry.status is OutboxStatus.FAILED

    wait_until(failed, 20, "the failed entry", stack)
    answer = stack.outboxes()[thread].get(outbox_id_for(run, ANSWER))
    assert answer is not None and "channel_not_found" in (answer.error or "")
    assert answer.attempts <= 2  # one more if the double rate limited the first
    # A marker: a later turn in the thread, refused in turn. The chat lane delivers in
    # order, so a refused post still being retried would hold the marker back.
    marker, _ = stack.say("c1", channel, "marker", thread_ts=payload["event"]["ts"])
    marker_id = outbox_id_for(run_of(marker, thread), ANSWER)

    def marker_failed() -> bool:
        outbox = stack.outboxes().get(thread)
        entry = outbox.get(marker_id) if outbox else None
        return entry is not None and entry.status is OutboxStatus.FAILED

    wait_until(marker_failed, 20, "the marker's failed entry", stack)
    again = stack.outboxes()[thread].get(outbox_id_for(run, ANSWER))
    assert again is not None and again.attempts == answer.attempts, "a refused post was retried"
    assert stack.double.bot_posts(channel) == []


def test_the_webhook_gets_the_answer_once_with_its_key_and_signature_through_5xx(
        stack: Stack, receiver: WebhookReceiver) -> None:
    """Through two 5xx the webhook gets the same signed answer, with its key, until one 200."""
    channel = unique_channel()
    payload, _ = stack.say("c1", channel, "tell the webhook")
    thread = thread_of(payload)
    run = run_of(payload, thread)
    key = outbox_id_for(run, WEBHOOK)
    wait_until(lambda: any(r.status == 200 for r in receiver.for_key(key)), 30, "the webhook", stack)
    # A marker: a later turn in the thread, whose webhook goes through once it is
    # delivered. The webhook lane is in order: a repeat of the first came before it.
    marker = stack.marker_turn("c1", channel, thread_ts=payload["event"]["ts"])
    marker_key = outbox_id_for(marker, WEBHOOK)
    wait_until(lambda: any(r.status == 200 for r in receiver.for_key(marker_key)), 30,
               "the marker's webhook", stack)
    received = receiver.for_key(key)
    assert [r.status for r in received] == [500, 500, 200]
    assert len({r.body for r in received}) == 1
    for r in received:
        assert verify(WEBHOOK_SECRET, r.timestamp, r.body, r.signature, now_s=time.time())
    body = json.loads(received[0].body)
    assert body["run_id"] == run and body["thread_id"] == thread
    assert body["message"]["text"].startswith("You said: tell the webhook.")
    events = stack.events(completed({run}))
    assert any(isinstance(e, RunAccepted) and e.run_id == run for e in events)
