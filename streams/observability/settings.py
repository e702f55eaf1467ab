"""The observability settings: metrics ports, the OTLP endpoint and sampling, the log format.

    THREADLINE_METRICS_PORT         a role's Prometheus port (processor, worker, connector);
                                    unset or 0: none. `threadline run` gives each role its own,
                                    from this port up (default 9464: processor 9464, worker 9465)
    THREADLINE_METRICS              "off": record no metrics at all (the benchmarks' baseline)
    THREADLINE_METRICS_HOST         the address those ports bind (default 127.0.0.1)
    THREADLINE_GATEWAY_METRICS      "0" turns off the gateway's GET /metrics (on by default)
    THREADLINE_OTLP_ENDPOINT        OTLP/HTTP traces endpoint, e.g. http://collector:4318/v1/traces;
                                    unset: no tracing at all (the default)
    THREADLINE_TRACE_SAMPLE_RATIO   the share of new traces recorded (default 1.0); a trace
                                    begun upstream follows its parent's sampled flag
    THREADLINE_LOG_FORMAT           "text" (default) or "json": one JSON object a line
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_RUN_METRICS_PORT", "ObservabilitySettings"]

DEFAULT_RUN_METRICS_PORT = 9464  # `threadline run`: the processor's; the worker's is the next one


@dataclass(frozen=True, slots=True)
class ObservabilitySettings:
    """How a role shows itself: metrics, traces and the log format."""

    metrics: bool = True
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    gateway_metrics: bool = True
    otlp_endpoint: str | None = None
    trace_sample_ratio: float = 1.0
    log_format: str = "text"

    @property
    def tracing(self) -> bool:
        """Whether spans are made and exported at all."""
        return self.otlp_endpoint is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ObservabilitySettings:
        """The settings from THREADLINE_* variables, defaults where unset."""
        port = int(env.get("THREADLINE_METRICS_PORT") or 0)
        log_format = (env.get("THREADLINE_LOG_FORMAT") or "text").strip().lower()
        if log_format not in ("text", "json"):
            raise ValueError(f"THREADLINE_LOG_FORMAT={log_format!r}: text or json")
        ratio = float(env.get("THREADLINE_TRACE_SAMPLE_RATIO") or 1.0)
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"THREADLINE_TRACE_SAMPLE_RATIO={ratio}: between 0 and 1")
        return cls(
            metrics=(env.get("THREADLINE_METRICS") or "on").strip().lower() not in ("off", "0", "false"),
            metrics_port=port or None,
            metrics_host=env.get("THREADLINE_METRICS_HOST") or "127.0.0.1",
            gateway_metrics=(env.get("THREADLINE_GATEWAY_METRICS") or "1").strip().lower()
            not in ("0", "false", "no", "off"),
            otlp_endpoint=env.get("THREADLINE_OTLP_ENDPOINT") or None,
            trace_sample_ratio=ratio,
            log_format=log_format,
        )
