"""OpenTelemetry traces across the Kafka hops, off unless THREADLINE_OTLP_ENDPOINT is set.

The trace context travels in what the records already carry (docs/operations.md):

* HTTP: the gateway's server span continues a client's `traceparent` header.
* Commands and events: the envelope's W3C `traceparent` (the gateway's one per
  command is also how it matches a decision to its request, so the processor keeps
  copying it onto the events unchanged).
* Every record besides: a Kafka record header `traceparent` (the OpenTelemetry
  messaging convention), which a reader prefers over the envelope's field. The
  processor puts its decision's span there on the dispatch, lifecycle, message and
  state records it writes; the gateway its publish span on each command.
* The worker puts its attempt's span in the envelopes it writes (stream records,
  reports), so the processor's decision on a report is a child of the attempt.

Sampling is decided once, where a trace begins (`THREADLINE_TRACE_SAMPLE_RATIO`, a
parent-based ratio sampler); downstream roles follow the sampled flag, and make no
span at all for a record whose trace is not sampled (`sampled`): on the
processor's path that is one string check a record.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags, Tracer

from streams.observability.settings import ObservabilitySettings

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["HEADER", "context_of", "current_traceparent", "fresh_traceparent_in_current", "header_of",
           "publish_span", "record_traceparent", "sampled", "setup_tracing", "trace_id_of",
           "traceparent_of", "tracer"]

log = logging.getLogger("threadline.tracing")

HEADER = "traceparent"
_tracer: Tracer | None = None
_provider: TracerProvider | None = None


def setup_tracing(settings: ObservabilitySettings, role: str) -> bool:
    """Export this process's spans to the OTLP endpoint, if one is set; whether it does."""
    global _tracer, _provider
    if not settings.tracing or _tracer is not None:
        return _tracer is not None
    # The SDK and the exporter are imported only here: a role without tracing does not
    # pay for them at start (a processor's start is on the clock of the first heartbeats).
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    endpoint = settings.otlp_endpoint
    assert endpoint is not None
    if not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"threadline-{role}", "threadline.role": role}),
        sampler=ParentBased(TraceIdRatioBased(settings.trace_sample_ratio)))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint),
                                                   schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    _provider, _tracer = provider, provider.get_tracer("threadline")
    atexit.register(provider.shutdown)  # the last spans go out on a clean exit
    log.info("%s exports traces to %s (sampling %.3g of new traces)", role, endpoint,
             settings.trace_sample_ratio)
    return True


def tracer() -> Tracer | None:
    """The tracer of this process, or None when tracing is off."""
    return _tracer


def sampled(traceparent: str | None) -> bool:
    """Whether a W3C traceparent is well formed enough and has its sampled flag set."""
    return traceparent is not None and len(traceparent) == 55 and traceparent[54] in "13579bdf"


def context_of(traceparent: str | None) -> Context | None:
    """A context whose (remote) parent is `traceparent`; None if it is not valid."""
    if traceparent is None or len(traceparent) != 55:
        return None
    try:
        version, trace_id, span_id, flags = traceparent.split("-")
        context = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                              trace_flags=TraceFlags(int(flags, 16)))
    except ValueError:
        return None
    if version != "00" or not context.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(context))


def traceparent_of(span: Span) -> str | None:
    """The W3C traceparent naming `span`, or None for an invalid span."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def current_traceparent() -> str | None:
    """The traceparent of the current span, if there is a valid one."""
    return traceparent_of(trace.get_current_span())


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32-hex-digit trace id of a traceparent."""
    return traceparent[3:35] if traceparent is not None and len(traceparent) == 55 else None


def fresh_traceparent_in_current() -> str | None:
    """A traceparent with a fresh span id in the current span's trace (and sampled flag)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{secrets.token_hex(8)}-{int(context.trace_flags):02x}"


def header_of(traceparent: str | None) -> list[tuple[str, str | bytes | None]] | None:
    """Kafka record headers carrying `traceparent` (None without one)."""
    return None if traceparent is None else [(HEADER, traceparent.encode())]


def record_traceparent(headers: object, envelope: str | None) -> str | None:
    """A record's trace parent: its `traceparent` header (in a list of name, value
    pairs, as confluent-kafka and aiokafka give them), else its envelope's field."""
    if isinstance(headers, list | tuple):
        for name, value in headers:
            if name == HEADER and value:
                return value.decode() if isinstance(value, bytes) else str(value)
    return envelope


@contextlib.contextmanager
def publish_span(topic: str, what: str, thread_id: str) -> Iterator[list[tuple[str, bytes]] | None]:
    """With tracing on and the current trace sampled: a producer span for sending one
    record to `topic`, and the record headers naming it; else no span and None."""
    if _tracer is None or not trace.get_current_span().is_recording():
        yield None
        return
    with _tracer.start_as_current_span(f"send {what}", kind=SpanKind.PRODUCER, attributes={
            "messaging.system": "kafka", "messaging.destination.name": topic,
            "messaging.operation.type": "send", "threadline.thread_id": thread_id}) as span:
        traceparent = traceparent_of(span)
        yield None if traceparent is None else [(HEADER, traceparent.encode())]
