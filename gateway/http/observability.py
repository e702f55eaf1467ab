"""The gateway's metrics, its `/metrics` endpoint, its server spans and log context.

`observe_middleware` is the outermost middleware: it counts every request by method,
route template (never the path itself: thread and run ids would make the labels
unbounded) and status, times it, and with tracing on makes the request's server
span, continuing a client's `traceparent`. Commands published inside that span are
in its trace (`gateway.model.decisions`). `GET /metrics` (THREADLINE_GATEWAY_METRICS=0
turns it off) serves Prometheus' text format without an API key, and reads the
stream feed's lag per partition at each scrape.
"""

from __future__ import annotations

import time

from aiohttp import web
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from gateway.http.problems import Handler
from gateway.keys import FEED
from streams.observability import logs, tracing
from streams.observability.metrics import gateway_metrics, set_metrics_enabled

__all__ = ["metrics_endpoint", "observe_app", "observe_middleware", "route_of"]


def route_of(request: web.Request) -> str:
    """The request's route template (`/v1/threads/{thread_id}`), or `unmatched`."""
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count and time the request; with tracing, its server span."""
    metrics = gateway_metrics()
    route, method = route_of(request), request.method
    info = request.match_info
    logs.bind(thread_id=info.get("thread_id"), run_id=info.get("run_id"))
    started = time.perf_counter()
    status = 500
    tracer = tracing.tracer()
    span = None
    if tracer is not None and route != "/metrics":
        span = tracer.start_span(f"{method} {route}", tracing.context_of(request.headers.get("traceparent")),
                                 SpanKind.SERVER, attributes={"http.request.method": method,
                                                              "http.route": route})
        for name in ("thread_id", "run_id"):
            if name in info:
                span.set_attribute(f"threadline.{name}", info[name])
    try:
        if span is None:
            response = await handler(request)
        else:
            with trace.use_span(span, end_on_exit=False):
                response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        metrics.requests.inc(method, route, str(status))
        metrics.request_seconds(method, route).observe(time.perf_counter() - started)  # type: ignore[union-attr]
        if span is not None:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            span.end()


async def metrics_endpoint(request: web.Request) -> web.Response:
    """GET /metrics: every metric of this process, in Prometheus' text format."""
    metrics = gateway_metrics()
    for partition, lag in request.config_dict[FEED].lags().items():
        metrics.feed_lag(str(partition)).set(lag)  # type: ignore[union-attr]
    return web.Response(body=generate_latest(REGISTRY),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


def observe_app(app: web.Application) -> None:
    """Add /metrics (unless turned off) and the gauges read from the app's objects."""
    settings = app[FEED].settings
    set_metrics_enabled(settings.observability.metrics)
    metrics = gateway_metrics()
    feed = app[FEED]
    metrics.sse_streams.set_function(lambda: len(feed.subscribers))
    if settings.observability.gateway_metrics:
        app.router.add_get("/metrics", metrics_endpoint)
