"""The calls, against the chat double (no Kafka): the Slack client, the webhook
sink, and how `Calls` chooses, fences and takes in outcomes."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from streams.config import Settings
from streams.connectors.calls import Done, Found, NotFound, NotSent, Refused, Retry
from streams.connectors.config import ConnectorConfig
from streams.connectors.delivery import Calls, Job, _Runtime
from streams.connectors.ids import message_id_for
from streams.connectors.outbox import (
    ANSWER,
    ChatOutbox,
    OutboxStatus,
    Sinks,
    mark_delivering,
    mark_failed,
    plan,
)
from streams.connectors.slack_api import SlackApi
from streams.connectors.stats import ConnectorStats
from streams.connectors.webhook import WebhookSink, sign, verify
from streams.core.domain import AssistantMessage, RunAccepted, RunCompleted
from streams.core.ids import outbox_id_for
from streams.devtools.broker import free_port
from tests.connectors.chat_double import ChatDouble
from tests.connectors.webhook_receiver import WebhookReceiver

THREAD = "slack:T1:C1:1700000000.000100"


@pytest.fixture
def double() -> Iterator[ChatDouble]:
    """A running chat double."""
    chat = ChatDouble().start()
    yield chat
    chat.stop()


def _config(**env: str) -> ConnectorConfig:
    return ConnectorConfig.from_env(Settings.from_env({}), {"THREADLINE_SLACK_BOT_TOKEN": "xoxb-t", **env})


def _outbox(*, completed: bool = False) -> ChatOutbox:
    asked = message_id_for("T1", "C1", "1700000000.000200")
    outbox = plan(None, RunAccepted(THREAD, "r1", "wf", asked, 1), "slack:T1",
                  Sinks(True, False), 1_000)
    assert outbox is not None
    if completed:
        done = RunCompleted(THREAD, "r1", 1, AssistantMessage("a1", "final"), 2)
        outbox = plan(outbox, done, "slack:T1", Sinks(True, False), 1_001) or outbox
    return outbox


# --- the Slack client ------------------------------------------------------------------------


def test_a_post_carries_its_outbox_id_and_is_found_again_in_its_thread(double: ChatDouble) -> None:
    """A post carries its outbox id; reconciliation finds it past a page of replies, and no unmade one."""
    api = SlackApi(double.api_url, "xoxb-t")
    for n in range(250):  # more than a page of replies
        assert isinstance(api.post_message("C1", f"noise {n}", "1700000000.000100", f"other-{n}"), Done)
    posted = api.post_message("C1", "hello", "1700000000.000100", "the-id")
    assert isinstance(posted, Done) and posted.result_ts
    (message,) = [m for m in double.bot_posts("C1") if m.ts == posted.result_ts]
    assert message.outbox_id == "the-id" and message.thread_ts == "1700000000.000100"
    assert api.find_outbox_message("C1", "1700000000.000100", "the-id", 0) == Found(posted.result_ts)
    assert api.find_outbox_message("C1", "1700000000.000100", "never-posted", 0) == NotFound()
    top = api.post_message("C1", "top level", None, "top-id")
    assert isinstance(top, Done)
    assert api.find_outbox_message("C1", None, "top-id", time.time() - 60) == Found(top.result_ts or "")


def test_edits_and_reactions_are_idempotent_and_errors_are_classified(double: ChatDouble) -> None:
    """Edits and reactions can be repeated; a gone channel, a missing message or no token is refused."""
    api = SlackApi(double.api_url, "xoxb-t")
    posted = api.post_message("C1", "v1", None, "id-1")
    assert isinstance(posted, Done) and posted.result_ts
    for _ in range(2):
        assert isinstance(api.update("C1", posted.result_ts, "v2", "id-1"), Done)
    message = double.message("C1", posted.result_ts)
    assert message is not None and message.text == "v2"
    assert api.add_reaction("C1", posted.result_ts, "eyes") == Done(None, "reacted")
    assert api.add_reaction("C1", posted.result_ts, "eyes") == Done(None, "already_reacted")
    assert isinstance(api.post_message("CGONE1", "x", None, "id-2"), Refused)
    assert isinstance(api.update("C1", "1.000001", "x", "id-3"), Refused)
    assert isinstance(SlackApi(double.api_url, "").post_message("C1", "x", None, "id-4"), Refused)


def test_rate_limits_are_retried_after_the_servers_delay_and_a_dead_chat_was_not_called() -> None:
    """A 429 is retried after the server's delay; an unreachable chat is retried as surely not done."""
    limited = ChatDouble(rate_limit_every=1, retry_after_s=7).start()
    try:
        outcome = SlackApi(limited.api_url, "xoxb-t").post_message("C1", "x", None, "id")
        assert outcome == Retry("chat.postMessage: rate limited", 7.0, maybe_done=False,
                                rate_limited=True)
        assert limited.bot_posts() == []
    finally:
        limited.stop()
    refused = SlackApi(f"http://127.0.0.1:{free_port()}/api", "xoxb-t").post_message("C1", "x", None, "i")
    assert isinstance(refused, Retry) and not refused.maybe_done


# --- the webhook sink --------------------------------------------------------------------------


def test_webhook_signatures_verify_only_unchanged_and_recent() -> None:
    """A webhook signature verifies only with the same secret, body and a recent timestamp."""
    body, stamp = b'{"a":1}', str(int(time.time()))
    good = sign("s3cret", stamp, body)
    assert verify("s3cret", stamp, body, good, now_s=time.time())
    assert not verify("other", stamp, body, good, now_s=time.time())
    assert not verify("s3cret", stamp, b'{"a":2}', good, now_s=time.time())
    assert not verify("s3cret", stamp, body, good, now_s=time.time() + 301)


def test_the_webhook_sink_classifies_statuses() -> None:
    """The webhook sink retries 5xx and 429, refuses 404, and sends the same body again."""
    for status, expected in ((500, Retry), (429, Retry), (404, Refused)):
        receiver = WebhookReceiver(fail_first=1, fail_status=status).start()
        try:
            sink = WebhookSink(receiver.url, "s3cret")
            assert isinstance(sink.post('{"x":1}', "key-1"), expected)
            assert isinstance(sink.post('{"x":1}', "key-1"), Done)
            (first, second) = receiver.for_key("key-1")
            assert first.body == second.body == b'{"x":1}'
        finally:
            receiver.stop()


# --- Calls: choosing, the lease, outcomes ------------------------------------------------------


def test_a_call_whose_lease_ran_out_is_not_sent(double: ChatDouble) -> None:
    """A call whose fence lease ran out is not sent; a fresh one is."""
    config = _config(THREADLINE_CONNECTOR_LEASE_S="0.5")
    calls = Calls(config, ConnectorStats(), SlackApi(double.api_url, "xoxb-t"), None)
    outbox = _outbox()
    entry = outbox.entries[0]
    stale = Job(0, THREAD.encode(), entry, entry.text, None, None, False, time.monotonic() - 0.6)
    calls.launch(stale)
    (result,) = _wait_finished(calls)
    assert isinstance(result[1], NotSent)
    assert double.calls == [], "a request left after the lease"
    fresh = Job(0, THREAD.encode(), entry, entry.text, None, None, False, time.monotonic())
    calls.launch(fresh)
    (result,) = _wait_finished(calls)
    assert isinstance(result[1], Done) and len(double.bot_posts()) == 1
    calls.close()


def _wait_finished(calls: Calls) -> list[tuple[Job, object]]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = calls.finished()
        if found:
            return list(found)
        time.sleep(0.01)
    raise AssertionError("no call finished")


def test_a_post_that_may_have_been_made_is_reconciled_only_after_the_lease(double: ChatDouble) -> None:
    """A post a predecessor fenced is looked up only after its lease, then posted if not found."""
    config = _config(THREADLINE_CONNECTOR_LEASE_S="1", THREADLINE_CONNECTOR_CLOCK_MARGIN_S="0.5")
    calls = Calls(config, ConnectorStats(), SlackApi(double.api_url, "xoxb-t"), None)
    now = int(time.time() * 1000)
    outbox = mark_delivering(_outbox(), outbox_id_for("r1", ANSWER), now)  # a predecessor fenced it
    calls.restored(outbox)
    fenced: list[Job] = []
    assert calls.choose(0, b"k", outbox, now + 1_000, fenced.append) == outbox
    assert fenced == [] and calls.in_flight == {}, "reconciled within the predecessor's lease"
    calls.runtime[outbox.entries[0].outbox_id].not_before = 0
    calls.choose(0, b"k", outbox, now + 1_600, fenced.append)
    assert fenced == [] and len(calls.in_flight) == 1  # a reconciliation, not a call
    ((job, outcome),) = _wait_finished(calls)
    assert job.reconcile and outcome == NotFound()
    calls.note(job, outcome)
    again = calls.choose(0, b"k", outbox, now + 1_700, fenced.append)
    assert len(fenced) == 1 and again.entries[0].attempts == 2  # now fenced and called
    calls.close()


def test_an_edit_of_a_failed_post_fails_and_a_pending_edit_rides_on_its_post() -> None:
    """A pending edit is sent with its post; if the post fails, so does the edit."""
    calls = Calls(_config(), ConnectorStats(), None, None)
    outbox = _outbox(completed=True)
    post, edit, reaction = outbox.entries
    fenced: list[Job] = []
    chosen = calls.choose(0, b"k", outbox, 5, fenced.append)
    (job,) = fenced
    assert job.entry == post and job.coalesced_id == edit.outbox_id and job.text == "final"
    assert chosen.get(post.outbox_id).status is OutboxStatus.DELIVERING  # type: ignore[union-attr]
    failed = mark_failed(outbox, post.outbox_id, "channel_not_found", 6)
    after = calls.choose(0, b"k", failed, 7, fenced.append)
    assert after.get(edit.outbox_id).status is OutboxStatus.FAILED  # type: ignore[union-attr]
    assert after.get(reaction.outbox_id).status is OutboxStatus.PENDING  # type: ignore[union-attr]
    calls.close()


def test_outcomes_set_retries_and_record_results() -> None:
    """Outcomes schedule retries (reconciling if maybe done) and record delivered or adopted results."""
    calls = Calls(_config(), ConnectorStats(), None, None)
    outbox = _outbox()
    entry = outbox.entries[0]
    job = Job(0, b"k", entry, entry.text, None, None, False, time.monotonic())
    calls.note(job, Retry("HTTP 502", None, maybe_done=True))
    assert calls.runtime[entry.outbox_id].needs_reconcile
    assert calls.runtime[entry.outbox_id].not_before > time.monotonic()
    assert Calls.record(outbox, job, Retry("x", None, True), 5) == outbox
    recorded = Calls.record(outbox, job, Done("1.5"), 5)
    assert recorded.entries[0].status is OutboxStatus.DELIVERED and recorded.entries[0].result_ts == "1.5"
    adopted = Calls.record(outbox, job, Found("1.6"), 5)
    assert adopted.entries[0].adopted
    calls.close()


def test_a_reconciliation_read_before_the_thread_moved_away_and_back_counts_for_nothing(
        double: ChatDouble) -> None:
    """A lookup started before the partition was revoked and regained is not trusted."""
    config = _config(THREADLINE_CONNECTOR_LEASE_S="1", THREADLINE_CONNECTOR_CLOCK_MARGIN_S="0")
    calls = Calls(config, ConnectorStats(), SlackApi(double.api_url, "xoxb-t"), None)
    now = int(time.time() * 1000)
    outbox = mark_delivering(_outbox(), outbox_id_for("r1", ANSWER), now - 5_000)
    calls.restored(outbox)
    double.hold("xoxb-t")
    fenced: list[Job] = []
    calls.choose(0, b"k", outbox, now, fenced.append)
    deadline = time.monotonic() + 5
    while double.waiting["xoxb-t"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    calls.restored(outbox)  # the partition was revoked and assigned again meanwhile
    double.release("xoxb-t")
    ((job, outcome),) = _wait_finished(calls)
    assert job.reconcile and outcome == NotFound()
    calls.note(job, outcome)
    assert calls.runtime[job.entry.outbox_id].needs_reconcile, "a stale 'not found' was trusted"
    calls.choose(0, b"k", outbox, now, fenced.append)
    assert fenced == [] and len(calls.in_flight) == 1  # read again, not posted
    _wait_finished(calls)
    calls.close()


# --- redirects, secrets, Retry-After, backoff, the lease and the connection -------------------


@pytest.fixture
def trap() -> Iterator[WebhookReceiver]:
    """Where a redirect points: anything that arrives here was followed."""
    receiver = WebhookReceiver().start()
    yield receiver
    receiver.stop()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_the_chat_client_follows_no_redirect_and_never_resends_its_token(
        trap: WebhookReceiver, status: int) -> None:
    """The chat client refuses redirects and never sends its bot token elsewhere."""
    moved = ChatDouble(redirect_to=f"http://127.0.0.1:{trap.port}/elsewhere",
                       redirect_status=status).start()
    try:
        api = SlackApi(moved.api_url, "xoxb-secret")
        assert isinstance(api.post_message("C1", "x", None, "id"), Refused)
        assert isinstance(api.find_outbox_message("C1", "1.0", "id", 0), Refused)
        assert [c[0] for c in moved.calls] == ["chat.postMessage", "conversations.replies"]
    finally:
        moved.stop()
    assert trap.elsewhere == [], "the redirect was followed (with the bot token)"


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_the_webhook_sink_follows_no_redirect(trap: WebhookReceiver, status: int) -> None:
    """The webhook sink refuses redirects instead of following them."""
    moved = WebhookReceiver(redirect_to=f"http://127.0.0.1:{trap.port}/elsewhere",
                            redirect_status=status).start()
    try:
        outcome = WebhookSink(moved.url, "s3cret").post('{"x":1}', "key-1")
        assert isinstance(outcome, Refused) and str(status) in outcome.error
        assert len(moved.for_key("key-1")) == 1
    finally:
        moved.stop()
    assert trap.elsewhere == []


def test_an_empty_webhook_secret_is_refused() -> None:
    """A webhook with an empty signing secret is refused; no webhook needs no secret."""
    with pytest.raises(ValueError, match="THREADLINE_WEBHOOK_SECRET"):
        _config(THREADLINE_WEBHOOK_URL="https://example.com/hook", THREADLINE_WEBHOOK_SECRET="")
    with pytest.raises(ValueError, match="secret"):
        WebhookSink("https://example.com/hook", "")
    assert _config(THREADLINE_WEBHOOK_SECRET="").webhook_secret == ""  # no webhook: no secret needed


def test_a_servers_retry_after_is_capped() -> None:
    """A huge Retry-After from the server is capped at the configured maximum."""
    limited = ChatDouble(rate_limit_every=1, retry_after_s=10**9).start()
    calls = Calls(_config(THREADLINE_CONNECTOR_RETRY_AFTER_MAX_S="30"), ConnectorStats(),
                  SlackApi(limited.api_url, "xoxb-t"), None)
    try:
        entry = _outbox().entries[0]
        outcome = SlackApi(limited.api_url, "xoxb-t").post_message("C1", "x", None, "id")
        assert isinstance(outcome, Retry) and outcome.after_s == 10**9
        calls.note(Job(0, b"k", entry, entry.text, None, None, False, time.monotonic()), outcome)
        assert calls.runtime[entry.outbox_id].not_before <= time.monotonic() + 30
        assert calls.kind_not_before[entry.kind] <= time.monotonic() + 30
    finally:
        calls.close()
        limited.stop()
    assert _config().retry_after_max_s == 300.0


def test_the_backoff_after_thousands_of_failures_is_the_cap_not_an_overflow() -> None:
    """After 5,000 failures the retry delay is the cap, not an overflow."""
    calls = Calls(_config(), ConnectorStats(), None, None)
    chat = _outbox().entries[0]
    done = RunCompleted(THREAD, "r1", 1, AssistantMessage("a1", "final"), 2)
    hook = plan(None, done, "slack:T1", Sinks(False, True), 1_000)
    assert hook is not None
    for entry, cap in ((chat, 60.0), (hook.entries[0], 60.0)):
        calls.runtime[entry.outbox_id] = _Runtime(failures=5_000)
        job = Job(0, b"k", entry, entry.text, None, None, False, time.monotonic())
        calls.note(job, Retry("HTTP 502", None, maybe_done=False))
        assert time.monotonic() < calls.runtime[entry.outbox_id].not_before <= time.monotonic() + cap
    calls.close()


class _RawServer:
    """A bare TCP server: notes each accepted connection, answers one JSON reply per request."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.accepted.set()
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536) or b"\r\n\r\n"
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            reply = b'{"ok": true, "ts": "1.000001"}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: " + str(len(reply)).encode() + b"\r\n\r\n" + reply)

    def close(self) -> None:
        self.sock.close()


def test_the_lease_is_checked_once_the_connection_is_open() -> None:
    """Opening a connection (DNS, TCP, TLS) can take up to the call timeout: the
    lease is judged after it, the moment before the request is written."""
    server = _RawServer()
    try:
        api = SlackApi(f"http://127.0.0.1:{server.port}/api", "xoxb-t")
        seen: list[bool] = []

        def before_send() -> bool:
            seen.append(server.accepted.wait(2.0))
            return seen[-1]

        assert api.post_message("C1", "x", None, "id", before_send) == Done("1.000001", "posted")
        assert seen == [True], "the lease was checked before the connection was open"
    finally:
        server.close()


def test_calls_to_one_host_reuse_a_kept_alive_connection(double: ChatDouble) -> None:
    """Calls to one host reuse one kept-alive connection."""
    api = SlackApi(double.api_url, "xoxb-t")
    for n in range(3):
        assert isinstance(api.post_message("C1", f"m{n}", None, f"id-{n}", lambda: True), Done)
    assert api.find_outbox_message("C1", None, "id-2", 0) == Found(double.bot_posts()[-1].ts)
    assert len(double.peers) == 4 and len(set(double.peers)) == 1, double.peers
