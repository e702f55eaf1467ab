"""Observability: Prometheus metrics, OpenTelemetry traces and JSON logs for every role.

`settings` (what is on, from THREADLINE_* variables), `metrics` (each role's metrics
and the port that serves them), `tracing` (the tracer and the trace context on Kafka
records), `logs` (the JSON line format), and one module per role that wires them in
with as few lines as possible in the role itself: `processor`, `worker` (with the
agent wrapper). The gateway's are in gateway/http/observability.py. See docs/operations.md.
"""
