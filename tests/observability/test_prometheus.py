"""Every role's metrics, scraped by a real Prometheus server (Debian's package) from a
real stack of processes, read back through Prometheus' query API: posting N messages
moves the posts, decisions, attempts, completed runs and SSE events by exactly N (or
by exactly the events the clients received). Waits poll the query API, never sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from streams.config import Settings
from streams.connectors.topics import outbox_topic
from streams.observability import tracing
from streams.testing.sse import read_sse
from tests.connectors.webhook_receiver import WebhookReceiver
from tests.kafka_helpers import read_messages
from tests.observability.kit import AUTH, ObservedStack, Prometheus, observed_stack, prometheus_binary

pytestmark = pytest.mark.kafka

N = 5
POSTS = ('sum(threadline_gateway_http_requests_total{method="POST",'
         'route="/v1/threads/{thread_id}/user_message",status="202"})')
DECIDED_POSTS = 'sum(threadline_processor_commands_total{command="PostUserMessage",outcome="decided"})'
COMPLETED = 'sum(threadline_processor_commands_total{command="ReportAttemptCompleted",outcome="decided"})'
RUNS_COMPLETED = 'sum(threadline_processor_events_total{event="RunCompleted"})'
ATTEMPTS = "sum(threadline_worker_attempts_started_total)"
ATTEMPTS_DONE = 'sum(threadline_worker_attempts_total{outcome="completed"})'
SSE_EVENTS = "sum(threadline_gateway_sse_events_total)"
WEBHOOK_POSTS = 'sum(threadline_connector_posts_total{result="delivered"})'
QUERIES = (POSTS, DECIDED_POSTS, COMPLETED, RUNS_COMPLETED, ATTEMPTS, ATTEMPTS_DONE, SSE_EVENTS,
           WEBHOOK_POSTS)


@pytest.fixture(scope="module")
def webhook() -> Iterator[WebhookReceiver]:
    """Where the connector posts each completed run."""
    receiver = WebhookReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory,
          webhook: WebhookReceiver) -> Iterator[ObservedStack]:
    """The roles as processes, each serving its metrics; the connector posts to `webhook`."""
    with observed_stack(kafka_bootstrap, tmp_path_factory.mktemp("metrics"),
                        webhook_url=webhook.url) as running:
        yield running


@pytest.fixture(scope="module")
def prometheus(stack: ObservedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Prometheus scraping every role; returned once every target is up."""
    binary = prometheus_binary()
    with Prometheus(binary, Path(tmp_path_factory.mktemp("prometheus")), stack.metrics) as server:
        for job in stack.metrics:
            server.wait_value(f'up{{job="{job}"}}', lambda v: v == 1.0)
        yield server


async def _one_run(session: aiohttp.ClientSession, base: str, index: int) -> int:
    """Create a thread, post one message, read its run's events to `done`: how many came."""
    async with session.post(f"{base}/v1/threads", json={"title": f"m{index}"}, headers=AUTH) as r:
        assert r.status == 201, await r.text()
        thread_id = (await r.json())["thread_id"]
    async with session.post(f"{base}/v1/threads/{thread_id}/user_message",
                            json={"input_text": f"metrics {index}"}, headers=AUTH) as r:
        body = await r.json()
        assert r.status == 202 and body["status"] == "accepted", body
    events = await read_sse(session, f"{base}/v1/runs/{body['run_id']}/events", headers=AUTH)
    assert events[-1].event == "done", [e.event for e in events]
    return len(events)


async def test_prometheus_sees_every_role_move_by_the_messages_posted(
        stack: ObservedStack, prometheus: Prometheus, webhook: WebhookReceiver) -> None:
    """N posts: +N 202 posts, +N decided posts, +N attempts started and completed, +N
    completed runs, +N webhook posts; SSE events +exactly what the clients read; every
    role's families exist."""
    before = {q: prometheus.value(q) for q in QUERIES}
    async with aiohttp.ClientSession() as session:
        received = sum(await asyncio.gather(*(_one_run(session, stack.base, i) for i in range(N))))
    expected = {POSTS: N, DECIDED_POSTS: N, COMPLETED: N, RUNS_COMPLETED: N, ATTEMPTS: N,
                ATTEMPTS_DONE: N, SSE_EVENTS: received, WEBHOOK_POSTS: N}
    for query, delta in expected.items():
        target = before[query] + delta
        prometheus.wait_value(query, lambda v, t=target: v >= t)
    # Reached; and not past it: read again after a later scrape of every target.
    reached = time.time()
    for job in stack.metrics:
        prometheus.wait_value(f'timestamp(up{{job="{job}"}})', lambda v: v > reached + 0.5)
    after = {q: prometheus.value(q) for q in QUERIES}
    assert {q: after[q] - before[q] for q in expected} == expected, stack.logs()
    assert len({r.idempotency_key for r in webhook.requests}) == N
    # The outbox record an event plans carries the event's trace context as a header (later
    # ones, recording a call's result, are not caused by an event and carry none).
    settings = Settings.from_env(stack.env)
    records = read_messages(settings, outbox_topic(settings),
                            lambda m: (m.key(), tracing.record_traceparent(m.headers(), None)),
                            until=lambda found: len({k for k, _ in found}) >= N)
    traced = {key for key, parent in records if tracing.sampled(parent)}
    assert traced == {key for key, _ in records} and len(traced) == N, records
    assert prometheus.value('sum(threadline_connector_outbox_entries{status="pending"})') == 0
    # Each role's own families are there, with units and histograms where latency matters.
    for family in ("threadline_processor_transaction_commit_seconds_count",
                   'threadline_processor_transaction_phase_seconds_count{phase="send_offsets"}',
                   "threadline_processor_batch_records_count",
                   "threadline_processor_restore_seconds_count",
                   "threadline_worker_time_to_first_token_seconds_count",
                   "threadline_worker_agent_seconds_count",
                   "threadline_gateway_http_request_duration_seconds_count",
                   "threadline_gateway_write_lag_seconds_count"):
        assert prometheus.value(f"sum({family})") > 0, family
    assert prometheus.query("threadline_processor_consumer_lag_records"), "no lag per partition"
    assert prometheus.value("sum(threadline_gateway_sse_streams_open)") == 0
    assert prometheus.value("sum(threadline_worker_attempts_in_flight)") == 0
