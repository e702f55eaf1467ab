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
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from streams.env import Section

__all__ = ["DEFAULT_RUN_METRICS_PORT", "ObservabilityEnv", "ObservabilitySettings"]

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
    log_format: Literal["text", "json"] = "text"

    @property
    def tracing(self) -> bool:
        """Whether spans are made and exported at all."""
        return self.otlp_endpoint is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ObservabilitySettings:
        """The settings from THREADLINE_* variables, defaults where unset."""
        read = ObservabilityEnv.read(env)
        return cls(metrics=read.metrics, metrics_port=read.metrics_port or None,
                   metrics_host=read.metrics_host, gateway_metrics=read.gateway_metrics,
                   otlp_endpoint=read.otlp_endpoint, trace_sample_ratio=read.trace_sample_ratio,
                   log_format=read.log_format)


def _lower(raw: object) -> object:
    return raw.strip().lower() if isinstance(raw, str) else raw


_DEFAULT = ObservabilitySettings()


class ObservabilityEnv(Section):
    """The variables of `ObservabilitySettings`; its defaults are the dataclass's."""

    # Booleans take on/off, 1/0, true/false, yes/no.
    metrics: bool = Field(_DEFAULT.metrics, alias="THREADLINE_METRICS")
    metrics_port: int = Field(0, ge=0, le=65_535, alias="THREADLINE_METRICS_PORT")  # 0: none
    metrics_host: str = Field(_DEFAULT.metrics_host, alias="THREADLINE_METRICS_HOST")
    gateway_metrics: bool = Field(_DEFAULT.gateway_metrics, alias="THREADLINE_GATEWAY_METRICS")
    otlp_endpoint: str | None = Field(_DEFAULT.otlp_endpoint, alias="THREADLINE_OTLP_ENDPOINT")
    trace_sample_ratio: float = Field(_DEFAULT.trace_sample_ratio, ge=0, le=1,
                                      alias="THREADLINE_TRACE_SAMPLE_RATIO")
    log_format: Annotated[Literal["text", "json"], BeforeValidator(_lower)] = Field(
        _DEFAULT.log_format, alias="THREADLINE_LOG_FORMAT")
