"""An OTLP/HTTP trace receiver for tests: an aiohttp server (in a thread of its own)
that decodes each protobuf `ExportTraceServiceRequest` (opentelemetry-proto) and keeps
every span with its service name."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from dataclasses import dataclass

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from streams.devtools.broker import free_port

__all__ = ["OtlpReceiver", "ReceivedSpan"]


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    """One span as exported: ids in hex, parent '' for a root."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, object]
    events: tuple[str, ...] = ()


class OtlpReceiver:
    """Serves POST /v1/traces on 127.0.0.1 until `stop()`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="otlp", daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL a role's THREADLINE_OTLP_ENDPOINT names."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        """Start serving."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(30)
        return self

    def stop(self) -> None:
        """Stop serving and end the thread."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _export(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        spans = []
        for resource_spans in export.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes: dict[str, object] = {}
                    for a in span.attributes:
                        kind = a.value.WhichOneof("value")
                        attributes[a.key] = getattr(a.value, kind) if kind else None
                    spans.append(ReceivedSpan(service, span.name, span.kind, span.trace_id.hex(),
                                              span.span_id.hex(), span.parent_span_id.hex(),
                                              attributes, tuple(e.name for e in span.events)))
        with self._lock:
            self.spans.extend(spans)
            self.requests += 1
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans received so far of one trace."""
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_trace(self, trace_id: str, names: set[str], timeout: float = 90.0) -> list[ReceivedSpan]:
        """Poll until the trace holds a span of each name (or fail with what it holds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if names <= {s.name for s in spans}:
                return spans
            time.sleep(0.2)
        raise AssertionError(f"trace {trace_id} lacks {names - {s.name for s in self.trace(trace_id)}}: "
                             f"{sorted((s.service, s.name) for s in self.trace(trace_id))}")
