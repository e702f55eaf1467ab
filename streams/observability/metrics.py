"""Prometheus metrics of each role, and the port that serves them.

Each role's metrics are made once per process (`processor_metrics()`, ...), so a
process registers only the metrics of the roles it runs. Names follow Prometheus'
conventions: `threadline_<role>_<what>_<unit>`, counters end in `_total`, times
are seconds. Labels are bounded: command and event types, outcomes, routes as
templates, partitions; never thread, run or tenant ids. docs/operations.md lists
them all with what to alert on.

Hot paths do not touch a metric per record: the processor counts a batch's
decisions in a plain dict and adds them after the commit, through label children
cached here (`LabelCache`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from typing import Any, cast

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from streams.observability.settings import ObservabilitySettings

__all__ = ["GatewayMetrics", "LabelCache", "ProcessorMetrics", "WorkerMetrics",
           "gateway_metrics", "processor_metrics", "serve_metrics", "set_metrics_enabled",
           "worker_metrics"]

log = logging.getLogger("threadline.metrics")

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SLOW_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500)
RATE_BUCKETS = (1, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


_enabled = True


def set_metrics_enabled(enabled: bool) -> None:
    """THREADLINE_METRICS=off (benchmarks' baseline): metrics made after this record
    nothing. Call it before a role's first metric."""
    global _enabled
    _enabled = enabled


class _Null:
    """A metric that records nothing (THREADLINE_METRICS=off)."""

    def labels(self, *_: Any, **__: Any) -> _Null:
        return self

    def inc(self, *_: Any) -> None:
        pass

    def observe(self, *_: Any) -> None:
        pass

    def set(self, *_: Any) -> None:
        pass

    def set_function(self, *_: Any) -> None:
        pass


_NULL = _Null()


def _counter(*args: Any, **kwargs: Any) -> Counter:
    return Counter(*args, **kwargs) if _enabled else cast(Counter, _NULL)


def _gauge(*args: Any, **kwargs: Any) -> Gauge:
    return Gauge(*args, **kwargs) if _enabled else cast(Gauge, _NULL)


def _histogram(*args: Any, **kwargs: Any) -> Histogram:
    return Histogram(*args, **kwargs) if _enabled else cast(Histogram, _NULL)


class LabelCache:
    """A metric's label children by label values, looked up once each."""

    def __init__(self, metric: Counter | Gauge | Histogram) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Counter | Gauge | Histogram] = {}

    def __call__(self, *values: str) -> Counter | Gauge | Histogram:
        """The child of these label values."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child

    def inc(self, *values: str, amount: float = 1.0) -> None:
        """Add `amount` to the counter child of these label values."""
        self(*values).inc(amount)  # type: ignore[union-attr]


class ProcessorMetrics:
    """The thread processor's metrics (streams/processor.py, streams/kafka/loop.py)."""

    def __init__(self) -> None:
        self.commands = LabelCache(_counter(
            "threadline_processor_commands_total",
            "Commands processed, by command type and outcome (decided: events written; "
            "unchanged: decided nothing, e.g. a repeat or a stale report; dead_lettered)",
            ["command", "outcome"]))
        self.events = LabelCache(_counter(
            "threadline_processor_events_total", "Events decided, by event type", ["event"]))
        self.batch_records = _histogram(
            "threadline_processor_batch_records", "Records consumed per transactional step",
            buckets=BATCH_BUCKETS)
        self.commit_seconds = _histogram(
            "threadline_processor_transaction_commit_seconds",
            "From begin_transaction to a committed transaction (produce, send offsets, commit)",
            buckets=LATENCY_BUCKETS)
        self.phase_seconds = LabelCache(_histogram(
            "threadline_processor_transaction_phase_seconds",
            "Each phase of a committed transaction: begin_and_produce, send_offsets "
            "(the input offsets to the group coordinator), commit (flush and end the "
            "transaction)", ["phase"], buckets=LATENCY_BUCKETS))
        self.aborts = _counter("threadline_processor_transaction_aborts_total",
                              "Transactions aborted and their batch rewound")
        self.rebalances = LabelCache(_counter(
            "threadline_processor_rebalances_total",
            "Partition assignment changes of the processor group", ["change"]))
        self.restore_seconds = _histogram(
            "threadline_processor_restore_seconds",
            "Time to restore the tables of the partitions one assignment brought, from their changelogs",
            buckets=SLOW_BUCKETS)
        self.dead_letters = LabelCache(_counter(
            "threadline_processor_dead_letters_total", "Records sent to the dead-letter topic",
            ["error_type"]))
        self.consumer_lag = LabelCache(_gauge(
            "threadline_processor_consumer_lag_records",
            "Commands not yet processed: the partition's end offset less the next offset to read",
            ["partition"]))
        self.partitions = _gauge("threadline_processor_partitions",
                                "Command partitions owned by this instance")
        self.deadlines = _gauge("threadline_processor_deadlines",
                               "Threads with a pending deadline (heartbeat, attempt, retry)")
        self.due_deadlines = _gauge("threadline_processor_due_deadlines",
                                   "Deadlines past due at the last tick")
        self.deadline_ticks = _counter("threadline_processor_deadline_ticks_total",
                                      "CheckDeadlines commands sent for due deadlines")


class WorkerMetrics:
    """The agent worker's metrics (streams/worker/, streams/observability/agent.py)."""

    def __init__(self) -> None:
        self.in_flight = _gauge("threadline_worker_attempts_in_flight",
                               "Attempts this worker runs now")
        self.attempts = LabelCache(_counter(
            "threadline_worker_attempts_total",
            "Attempts ended, by outcome (completed, failed, stopped) and reason",
            ["outcome", "reason"]))
        self.started = _counter("threadline_worker_attempts_started_total",
                               "Attempts started (ReportAttemptStarted sent)")
        self.heartbeats = _counter("threadline_worker_heartbeats_total", "Heartbeats sent")
        self.stream_records = _counter("threadline_worker_stream_records_total",
                                      "Stream records (answer parts) sent")
        self.first_token = _histogram(
            "threadline_worker_time_to_first_token_seconds",
            "From the agent's call to its first text", buckets=(*LATENCY_BUCKETS, 60.0))
        self.tokens_per_second = _histogram(
            "threadline_worker_tokens_per_second",
            "Text chunks a second of one model call, after its first", buckets=RATE_BUCKETS)
        self.agent_seconds = LabelCache(_histogram(
            "threadline_worker_agent_seconds", "Duration of one agent (model) call, by outcome",
            ["outcome"], buckets=SLOW_BUCKETS))
        self.tool_calls = _counter("threadline_worker_tool_calls_total", "Tool calls the agents made")


class GatewayMetrics:
    """The gateway's metrics (gateway/http/observability.py)."""

    def __init__(self) -> None:
        self.requests = LabelCache(_counter(
            "threadline_gateway_http_requests_total",
            "HTTP requests answered, by method, route template and status", ["method", "route", "status"]))
        self.request_seconds = LabelCache(_histogram(
            "threadline_gateway_http_request_duration_seconds",
            "Time to answer an HTTP request (SSE streams: until the stream ends)",
            ["method", "route"], buckets=LATENCY_BUCKETS))
        self.sse_streams = _gauge("threadline_gateway_sse_streams_open", "Open SSE streams")
        self.sse_events = _counter("threadline_gateway_sse_events_total",
                                  "SSE events written to clients (live and replayed)")
        self.forwarded_streams = _counter(
            "threadline_gateway_forwarded_streams_total",
            "Streams of threads another gateway owns, opened on that owner (re-opens included)")
        self.forwarded_requests = _counter(
            "threadline_gateway_forwarded_requests_total",
            "Requests about a thread another gateway holds, sent on whole to it")
        self.replays = _counter("threadline_gateway_replays_total",
                               "Streams that replayed older events from Kafka")
        self.replay_events = _histogram("threadline_gateway_replay_events",
                                       "Events one Kafka replay sent",
                                       buckets=(0, 1, 10, 100, 1_000, 10_000, 100_000))
        self.write_lag = _histogram(
            "threadline_gateway_write_lag_seconds",
            "From a stream record's CreateTime until its events were written to the clients",
            buckets=LATENCY_BUCKETS)
        self.feed_lag = LabelCache(_gauge(
            "threadline_gateway_feed_lag_records",
            "Stream records the feed has not read yet, by partition", ["partition"]))
        self.pending = LabelCache(_counter(
            "threadline_gateway_pending_total",
            "Commands answered 202 pending: no decision within THREADLINE_DECISION_TIMEOUT_S",
            ["command"]))
        self.commands = LabelCache(_counter(
            "threadline_gateway_commands_published_total", "Commands queued to Kafka, by type",
            ["command"]))


@cache
def processor_metrics() -> ProcessorMetrics:
    """This process's processor metrics (registered on first use)."""
    return ProcessorMetrics()


@cache
def worker_metrics() -> WorkerMetrics:
    """This process's worker metrics (registered on first use)."""
    return WorkerMetrics()


@cache
def gateway_metrics() -> GatewayMetrics:
    """This process's gateway metrics (registered on first use)."""
    return GatewayMetrics()


def serve_metrics(settings: ObservabilitySettings, role: str,
                  register: Callable[[], object] | None = None) -> bool:
    """Serve the default registry on THREADLINE_METRICS_PORT, if set; whether it does."""
    if register is not None:
        register()  # the role's metrics exist (at zero) from the first scrape
    if settings.metrics_port is None:
        return False
    try:
        start_http_server(settings.metrics_port, settings.metrics_host)
    except OSError as exc:  # a taken port must not stop the role (a supervisor would crash-loop it)
        log.error("%s metrics: cannot serve on %s:%d (%s); running without a metrics port", role,
                  settings.metrics_host, settings.metrics_port, exc)
        return False
    log.info("%s metrics on http://%s:%d/metrics", role, settings.metrics_host, settings.metrics_port)
    return True
