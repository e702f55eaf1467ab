"""JSON log lines (THREADLINE_LOG_FORMAT=json): one object a line, with context.

Each line has `ts`, `level`, `logger`, `pid`, `message`, and whichever of
`thread_id`, `run_id`, `attempt`, `tenant` and `trace_id` are known where it was
logged: `bind` sets them for the current task (the worker for an attempt, the
gateway for a request), and the trace id is the current span's, else the bound
traceparent's. Nothing secret: lines go through `redact`, which masks bearer
tokens, API-key-like strings and `key=value` secrets; message text is not logged
by any role. Text logs stay the default (tests wait for their markers).
"""

from __future__ import annotations

import json
import logging
import re
import time
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace

from streams.observability.tracing import trace_id_of

__all__ = ["JsonFormatter", "bind", "install_json_logs", "redact"]

FIELDS = ("thread_id", "run_id", "attempt", "tenant")
_context: ContextVar[dict[str, Any] | None] = ContextVar("threadline_log_context", default=None)

_SECRETS = re.compile(
    r"(?i)(bearer\s+)[^\s\"',;]+"  # Authorization: Bearer <token>
    r"|\b(sk-|xox[abprs]-)[A-Za-z0-9_\-]{6,}"  # OpenAI and Slack style keys
    r"|((?:api[_-]?key|token|password|secret|authorization)[\"']?\s*[=:]\s*[\"']?)"
    r"(?:bearer\s+)?[^\s\"',;&]+")


def redact(text: str) -> str:
    """`text` with bearer tokens, API keys and `secret=...` values masked."""
    return _SECRETS.sub(lambda m: (m.group(1) or m.group(2) or m.group(3) or "") + "[redacted]", text)


def bind(**fields: Any) -> None:
    """Add fields (thread_id, run_id, attempt, tenant, traceparent) to this task's log lines."""
    current = _context.get()
    _context.set({**(current or {}), **{k: v for k, v in fields.items() if v is not None}})


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line, redacted."""
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "pid": record.process,
            "message": redact(record.getMessage()),
        }
        context = _context.get() or {}
        for name in FIELDS:
            value = getattr(record, name, None) or context.get(name)
            if value is not None:
                line[name] = value
        span = trace.get_current_span().get_span_context()
        trace_id = f"{span.trace_id:032x}" if span.is_valid else trace_id_of(context.get("traceparent"))
        if trace_id is not None:
            line["trace_id"] = trace_id
        if record.exc_info:
            line["error"] = redact(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False, default=str)


def install_json_logs(level: str | int) -> None:
    """Every log line of this process as JSON on stderr (replacing the text format)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
