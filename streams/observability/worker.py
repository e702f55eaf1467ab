"""What the worker shows: attempt metrics, the attempt's span, and the agent's.

* `ObservedOutlet` counts what an execution reports (attempts started, heartbeats,
  outcomes by reason, once the broker acked them) and the stream records it sends;
  each answer part but the text deltas is an event on the attempt's span.
* `ObservedAgent` wraps any agent: the model call's latency, time to first token,
  tokens (text chunks) a second, tool calls, and with tracing a span for the call
  and one for each tool call (from its `tool_call` step to its `tool_result`).
* `attempt_span` makes the attempt's span, a child of the processor's decision (the
  dispatch record's `traceparent` header), and puts it in the execution's envelope
  metadata: its stream records and reports then name it as their parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from streams.agents import Agent, AgentError, AgentOutput, AgentStep, TextChunk
from streams.core.domain import (
    Command,
    ReportAttemptCompleted,
    ReportAttemptFailed,
    ReportAttemptStarted,
    ReportHeartbeat,
)
from streams.core.reasons import FailureCode
from streams.core.records import HistoryMessage, StreamOutput, TextDelta
from streams.observability import logs, tracing
from streams.observability.metrics import worker_metrics
from streams.wire import EnvelopeMeta
from streams.worker.execution import SHUTDOWN_ERROR, Execution, Outlet

__all__ = ["ObservedAgent", "ObservedOutlet", "attempt_span", "bind_attempt", "outcome_reason",
           "with_record_parent"]


def outcome_reason(command: ReportAttemptCompleted | ReportAttemptFailed) -> tuple[str, str]:
    """The (outcome, reason) labels of an outcome report: a bounded set."""
    if isinstance(command, ReportAttemptCompleted):
        return "completed", "ok"
    if command.error == SHUTDOWN_ERROR:
        return "failed", "shutdown"
    if command.error == FailureCode.OUTPUT_TOO_LARGE:
        return "failed", FailureCode.OUTPUT_TOO_LARGE.value
    return "failed", "agent_error_retryable" if command.retryable else "agent_error"


class ObservedOutlet(Outlet):
    """An `Outlet` that counts what goes through it."""

    async def stream(self, output: StreamOutput, meta: EnvelopeMeta,
                     partition: int) -> asyncio.Future[Any]:
        """Send a stream record (see `Outlet.stream`), counted."""
        delivery = await super().stream(output, meta, partition)
        worker_metrics().stream_records.inc()
        if not isinstance(output.payload, TextDelta):  # the answer's parts, on the attempt's span
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(f"stream {type(output.payload).__name__}",
                               {"threadline.seq": output.seq, "messaging.kafka.partition": partition})
        return delivery

    async def command(self, command: Command, meta: EnvelopeMeta,
                      partition: int) -> asyncio.Future[Any]:
        """Send a report (see `Outlet.command`); counted once the broker acks it."""
        delivery = await super().command(command, meta, partition)
        delivery.add_done_callback(lambda done: _count_report(command, done))
        return delivery


def _count_report(command: Command, delivery: asyncio.Future[Any]) -> None:
    if delivery.cancelled() or delivery.exception() is not None:
        return
    metrics = worker_metrics()
    if isinstance(command, ReportHeartbeat):
        metrics.heartbeats.inc()
    elif isinstance(command, ReportAttemptStarted):
        metrics.started.inc()
    elif isinstance(command, ReportAttemptCompleted | ReportAttemptFailed):
        metrics.attempts.inc(*outcome_reason(command))


def with_record_parent(meta: EnvelopeMeta, headers: object) -> EnvelopeMeta:
    """`meta` whose traceparent is the record's `traceparent` header, if it has one."""
    parent = tracing.record_traceparent(headers, meta.traceparent)
    return meta if parent == meta.traceparent else replace(meta, traceparent=parent)


def bind_attempt(execution: Execution) -> None:
    """Name the attempt on the log lines of the task that runs it."""
    logs.bind(thread_id=execution.meta.thread_id, run_id=execution.dispatch.run_id,
              attempt=execution.attempt, tenant=execution.meta.tenant,
              traceparent=execution.meta.traceparent)


@contextlib.contextmanager
def attempt_span(execution: Execution) -> Iterator[Span | None]:
    """The current span while an attempt runs (if its trace is sampled); its
    envelopes then carry it as their traceparent."""
    tracer = tracing.tracer()
    parent = execution.meta.traceparent
    if tracer is None or not tracing.sampled(parent):
        yield None
        return
    dispatch = execution.dispatch
    with tracer.start_as_current_span(
            "attempt", tracing.context_of(parent), SpanKind.CONSUMER,
            attributes={"messaging.system": "kafka", "messaging.kafka.partition": execution.partition,
                        "messaging.kafka.offset": execution.offset,
                        "threadline.thread_id": execution.meta.thread_id,
                        "threadline.run_id": dispatch.run_id,
                        "threadline.attempt": dispatch.attempt}) as span:
        execution.meta = replace(execution.meta, traceparent=tracing.traceparent_of(span))
        yield span


class ObservedAgent:
    """An agent whose calls are measured (and traced, when tracing is on)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def aclose(self) -> None:
        """Close the wrapped agent."""
        await self.agent.aclose()

    async def run(self, history: Sequence[HistoryMessage], message: str) -> AsyncIterator[AgentOutput]:
        """The wrapped agent's outputs, unchanged, measured on the way."""
        metrics = worker_metrics()
        tracer = tracing.tracer()
        span = None
        if tracer is not None and trace.get_current_span().is_recording():
            span = tracer.start_span("agent call", kind=SpanKind.CLIENT,
                                     attributes={"threadline.agent": type(self.agent).__name__,
                                                 "threadline.history_messages": len(history)})
        tools: dict[str, Span] = {}
        started = time.monotonic()
        first: float | None = None
        chunks = 0
        outcome = "cancelled"
        try:
            async for output in self.agent.run(history, message):
                if isinstance(output, TextChunk):
                    if output.text:
                        chunks += 1
                        if first is None:
                            first = time.monotonic()
                            metrics.first_token.observe(first - started)
                elif isinstance(output, AgentStep):
                    self._step(output, span, tools)
                yield output
            outcome = "completed"
        except AgentError as exc:
            outcome = "retryable_error" if exc.retryable else "error"
            raise
        except Exception:
            outcome = "broke"
            raise
        finally:
            ended = time.monotonic()
            metrics.agent_seconds(outcome).observe(ended - started)  # type: ignore[union-attr]
            if first is not None and chunks > 1 and ended > first:
                metrics.tokens_per_second.observe((chunks - 1) / (ended - first))
            for tool in tools.values():
                tool.end()
            if span is not None:
                span.set_attribute("threadline.text_chunks", chunks)
                if outcome != "completed":
                    span.set_status(Status(StatusCode.ERROR, outcome))
                span.end()

    @staticmethod
    def _step(output: AgentStep, span: Span | None, tools: dict[str, Span]) -> None:
        step = output.step
        if step.kind == "tool_call":
            worker_metrics().tool_calls.inc()
            tracer = tracing.tracer()
            if span is not None and tracer is not None:
                previous = tools.pop(step.name, None)
                if previous is not None:
                    previous.end()
                tools[step.name] = tracer.start_span(
                    f"tool {step.name}", trace.set_span_in_context(span), SpanKind.INTERNAL,
                    attributes={"threadline.tool": step.name})
        elif step.kind == "tool_result":
            tool = tools.pop(step.name, None)
            if tool is not None:
                tool.end()
