"""One message's trace, across the Kafka hops, from real role processes exporting
OTLP/HTTP to a receiver in this test: the gateway's request and publish spans, the
processor's decisions, the worker's attempt, its model call and tool call, every
span's parent present in the same trace. Waits poll the receiver, never sleep."""

from __future__ import annotations

import json
import secrets
import urllib.request
from collections.abc import Iterator

import pytest

from streams.config import Settings
from streams.observability import tracing
from tests.kafka_helpers import read_messages
from tests.observability.kit import AUTH, KEY, ObservedStack, observed_stack
from tests.observability.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.kafka

POST_ROUTE = "POST /v1/threads/{thread_id}/user_message"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    """The OTLP receiver, serving."""
    server = OtlpReceiver().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory,
          receiver: OtlpReceiver) -> Iterator[ObservedStack]:
    """The roles as processes, exporting every trace to the receiver."""
    with observed_stack(kafka_bootstrap, tmp_path_factory.mktemp("tracing"),
                        THREADLINE_OTLP_ENDPOINT=receiver.endpoint,
                        THREADLINE_TRACE_SAMPLE_RATIO="1", THREADLINE_LOG_FORMAT="json") as running:
        yield running


def _request(stack: ObservedStack, path: str, body: dict[str, object],
             headers: dict[str, str]) -> dict[str, object]:
    request = urllib.request.Request(stack.base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={**AUTH, **headers, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        result: dict[str, object] = json.loads(response.read())
        return result


def _one(spans: list[ReceivedSpan], service: str, name: str, **attributes: object) -> ReceivedSpan:
    found = [s for s in spans if s.service == service and s.name == name
             and all(s.attributes.get(k) == v for k, v in attributes.items())]
    assert len(found) == 1, (service, name, attributes, sorted((s.service, s.name) for s in spans))
    return found[0]


def test_one_trace_follows_a_message_across_the_kafka_hops(stack: ObservedStack,
                                                          receiver: OtlpReceiver) -> None:
    """A client's traceparent on the post: the gateway, processor and worker spans of that
    message are all in its trace, each parent link pointing at the span that caused it."""
    thread = _request(stack, "/v1/threads", {"title": "traced"}, {})
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    accepted = _request(stack, f"/v1/threads/{thread['thread_id']}/user_message",
                        {"input_text": "trace me"}, {"traceparent": f"00-{trace_id}-{client_span}-01"})
    run_id = accepted["run_id"]
    spans = receiver.wait_trace(trace_id, {POST_ROUTE, "send PostUserMessage", "decide PostUserMessage",
                                           "attempt", "agent call", "tool search",
                                           "decide ReportAttemptStarted",
                                           "decide ReportAttemptCompleted"})
    by_id = {s.span_id: s for s in spans}
    server = _one(spans, "threadline-gateway", POST_ROUTE)
    publish = _one(spans, "threadline-gateway", "send PostUserMessage")
    decide = _one(spans, "threadline-processor", "decide PostUserMessage")
    attempt = _one(spans, "threadline-worker", "attempt", **{"threadline.run_id": run_id})
    model = _one(spans, "threadline-worker", "agent call")
    tool = _one(spans, "threadline-worker", "tool search")
    started = _one(spans, "threadline-processor", "decide ReportAttemptStarted")
    completed = _one(spans, "threadline-processor", "decide ReportAttemptCompleted")
    assert server.parent_span_id == client_span  # HTTP: the client's context continued
    assert publish.parent_span_id == server.span_id
    assert decide.parent_span_id == publish.span_id  # Kafka: the command's header
    assert attempt.parent_span_id == decide.span_id  # Kafka: the dispatch's header
    assert model.parent_span_id == attempt.span_id
    # The stream records: the answer's parts sent within the attempt, in order.
    parts = [e for e in attempt.events if e.startswith("stream ")]
    assert parts[0] == "stream MessageStart" and parts[-1] == "stream MessageEnd", parts
    assert "stream StepOutput" in parts
    assert tool.parent_span_id == model.span_id
    assert started.parent_span_id == attempt.span_id  # Kafka: the report's envelope
    assert completed.parent_span_id == attempt.span_id
    assert completed.attributes.get("threadline.run_id") == run_id
    assert "RunCompleted" in str(completed.attributes.get("threadline.events"))
    # Parent links intact: every span but the request's has its parent in the trace.
    orphans = [(s.service, s.name) for s in spans if s is not server and s.parent_span_id not in by_id]
    assert not orphans, orphans
    assert {s.service for s in spans} == {"threadline-gateway", "threadline-processor",
                                          "threadline-worker"}
    # Records without a trace field carry it as a header: the thread's states, its stored
    # messages and its dispatch, each naming a processor decision of this trace.
    settings = Settings.from_env(stack.env)
    decisions = {s.span_id for s in spans if s.service == "threadline-processor"}
    for topic in (settings.topics.threads, settings.topics.messages, settings.topics.dispatch):
        parents = read_messages(settings, topic, lambda m: tracing.record_traceparent(m.headers(), None),
                                until=lambda found: any(p and trace_id in p for p in found))
        traced = [p for p in parents if p is not None and trace_id in p]
        assert traced and all(p.split("-")[2] in decisions for p in traced), (topic, parents)
    # JSON logs: the worker's lines of this attempt name the run, the tenant and the trace;
    # no role logs the message's text or the API key.
    lines = [json.loads(line) for line in stack.roles["worker"].output().splitlines()
             if line.startswith("{")]
    mine = [line for line in lines if line.get("run_id") == run_id]
    assert mine and all(line["trace_id"] == trace_id and line["tenant"] == "tenant-o"
                        and line["attempt"] == 1 for line in mine), mine
    for role in stack.roles.values():
        assert "trace me" not in role.output() and KEY not in role.output(), role.role
