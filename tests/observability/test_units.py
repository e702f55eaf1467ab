"""The pure parts of observability: settings, trace context helpers, JSON log lines
and their redaction, outcome labels, the agent wrapper's measurements."""

from __future__ import annotations

import contextvars
import io
import json
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from gateway.app import create_app
from gateway.http.auth import PUBLIC_PATHS
from streams.agents import AgentOutput, AgentStep, TextChunk
from streams.config import Settings
from streams.core.domain import ReportAttemptCompleted, ReportAttemptFailed, Step
from streams.core.records import HistoryMessage
from streams.core.thread import OUTPUT_TOO_LARGE
from streams.observability import logs, tracing
from streams.observability.logs import JsonFormatter, redact
from streams.observability.settings import ObservabilitySettings
from streams.observability.worker import ObservedAgent, outcome_reason
from streams.worker.execution import SHUTDOWN_ERROR

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_settings_defaults_are_off_but_for_the_gateway_endpoint() -> None:
    """No port, no tracing, text logs, metrics recorded, /metrics on the gateway."""
    s = ObservabilitySettings.from_env({})
    assert (s.metrics, s.metrics_port, s.gateway_metrics, s.tracing, s.log_format) == \
        (True, None, True, False, "text")
    s = ObservabilitySettings.from_env({
        "THREADLINE_METRICS_PORT": "9470", "THREADLINE_GATEWAY_METRICS": "0",
        "THREADLINE_OTLP_ENDPOINT": "http://c:4318", "THREADLINE_TRACE_SAMPLE_RATIO": "0.01",
        "THREADLINE_LOG_FORMAT": "JSON", "THREADLINE_METRICS": "off"})
    assert (s.metrics, s.metrics_port, s.gateway_metrics, s.tracing, s.trace_sample_ratio,
            s.log_format) == (False, 9470, False, True, 0.01, "json")
    with pytest.raises(ValueError):
        ObservabilitySettings.from_env({"THREADLINE_LOG_FORMAT": "xml"})
    with pytest.raises(ValueError):
        ObservabilitySettings.from_env({"THREADLINE_TRACE_SAMPLE_RATIO": "2"})


def test_trace_context_helpers() -> None:
    """Sampled flags, parents from headers before envelopes, invalid contexts refused."""
    assert tracing.sampled(TP) and not tracing.sampled(TP[:-2] + "00")
    assert not tracing.sampled(None) and not tracing.sampled("garbage")
    assert tracing.record_traceparent([("traceparent", TP.encode())], "other") == TP
    assert tracing.record_traceparent([("x", b"1")], "envelope") == "envelope"
    assert tracing.record_traceparent(None, None) is None
    assert tracing.context_of(TP) is not None
    assert tracing.context_of("00-" + "0" * 32 + "-b7ad6b7169203331-01") is None
    assert tracing.context_of("zz") is None
    assert tracing.trace_id_of(TP) == "0af7651916cd43dd8448eb211c80319c"
    assert tracing.header_of(TP) == [("traceparent", TP.encode())]


def test_redact_masks_keys_and_tokens() -> None:
    """Bearer tokens, Slack and OpenAI style keys and key=value secrets never reach a line."""
    line = redact("Authorization: Bearer s3cr3t-key x api_key=abc123 token: 'tok' sk-abcdefghijkl "
                  "xoxb-1234567890 ok")
    for secret in ("s3cr3t-key", "abc123", "tok'", "sk-abcdefghijkl", "xoxb-1234567890"):
        assert secret not in line, line
    assert line.endswith(" ok")


def test_json_lines_carry_the_bound_context_and_trace_id() -> None:
    """thread_id, run_id, attempt, tenant and the trace id of the bound traceparent."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("threadline.test-json")
    logger.addHandler(handler)
    logger.propagate = False
    def log_in_a_task() -> None:  # a context of its own: the binding does not outlive it
        logs.bind(thread_id="t-1", run_id="r-1", attempt=2, tenant="acme", traceparent=TP)
        logger.warning("posting with Bearer abc.def failed")

    try:
        contextvars.copy_context().run(log_in_a_task)
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert line["thread_id"] == "t-1" and line["run_id"] == "r-1" and line["attempt"] == 2
    assert line["tenant"] == "acme" and line["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert line["level"] == "WARNING" and "abc.def" not in line["message"]


def test_outcome_reasons_are_a_bounded_set() -> None:
    """Any error text maps to one of a few reasons."""
    done = ReportAttemptCompleted("t", "r", 1, "w", "x", (), (), 0)
    assert outcome_reason(done) == ("completed", "ok")
    reasons = {outcome_reason(ReportAttemptFailed("t", "r", 1, "w", error, retryable, 0))
               for error, retryable in ((SHUTDOWN_ERROR, True), (OUTPUT_TOO_LARGE, False),
                                        ("HTTP 500 from model x at 12:00", True), ("nope", False))}
    assert reasons == {("failed", "shutdown"), ("failed", "output_too_large"),
                       ("failed", "agent_error_retryable"), ("failed", "agent_error")}


class _Agent:
    async def run(self, history: Sequence[HistoryMessage], message: str) -> AsyncIterator[AgentOutput]:
        yield AgentStep(Step("tool_call", "search", "{}"))
        yield AgentStep(Step("tool_result", "search", "{}"))
        for word in ("a", "b", "c"):
            yield TextChunk(word)

    async def aclose(self) -> None:
        pass


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_the_agent_wrapper_passes_outputs_through_and_measures_them() -> None:
    """Same outputs; +1 call, +1 tool call, +1 first-token and tokens/s observation."""
    before = (_sample("threadline_worker_agent_seconds_count", {"outcome": "completed"}),
              _sample("threadline_worker_tool_calls_total"),
              _sample("threadline_worker_time_to_first_token_seconds_count"),
              _sample("threadline_worker_tokens_per_second_count"))
    outputs = [o async for o in ObservedAgent(_Agent()).run([], "hi")]
    assert [type(o).__name__ for o in outputs] == ["AgentStep", "AgentStep", "TextChunk", "TextChunk",
                                                   "TextChunk"]
    after = (_sample("threadline_worker_agent_seconds_count", {"outcome": "completed"}),
             _sample("threadline_worker_tool_calls_total"),
             _sample("threadline_worker_time_to_first_token_seconds_count"),
             _sample("threadline_worker_tokens_per_second_count"))
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 1, 1]


def test_the_gateway_metrics_endpoint_can_be_turned_off(tmp_path: Path) -> None:
    """GET /metrics is routed (and public) by default, and not with THREADLINE_GATEWAY_METRICS=0."""
    def routes(**env: str) -> set[str]:
        settings = Settings.from_env({"THREADLINE_DATA_DIR": str(tmp_path), **env})
        app = create_app(settings)
        return {r.resource.canonical for r in app.router.routes() if r.resource is not None}

    assert "/metrics" in routes() and "/metrics" in PUBLIC_PATHS
    assert "/metrics" not in routes(THREADLINE_GATEWAY_METRICS="0")
