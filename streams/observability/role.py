"""Turning a role's observability on at its start: metrics port, tracing, log format."""

from __future__ import annotations

from collections.abc import Callable

from streams.config import Settings
from streams.observability.metrics import serve_metrics, set_metrics_enabled
from streams.observability.tracing import setup_tracing

__all__ = ["observe_role"]


def observe_role(settings: Settings, role: str, register: Callable[[], object] | None = None) -> None:
    """Serve the role's metrics (THREADLINE_METRICS_PORT) and export its traces
    (THREADLINE_OTLP_ENDPOINT), each if set; `register` makes its metrics exist at zero."""
    set_metrics_enabled(settings.observability.metrics)
    serve_metrics(settings.observability, role, register)
    setup_tracing(settings.observability, role)
