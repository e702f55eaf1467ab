"""Typed keys of the objects the gateway app shares between handlers, and its tunables."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.http.limits import TenantLimiter
from gateway.kafka import Offsets
from gateway.live.feed import StreamFeed
from gateway.model.decisions import CommandBus
from gateway.model.read_model import ReadModel
from streams.config import Settings
from streams.wire import Codec

__all__ = ["BUS", "CODEC", "FEED", "LIMITER", "OFFSETS", "OPTIONS", "READ_MODEL", "SETTINGS", "Options"]


@dataclass(frozen=True, slots=True)
class Options:
    """Knobs of one gateway process (defaults suit production; tests shrink them)."""

    keepalive_s: float = 15.0
    retry_ms: int = 2_000
    window_events: int = 2_000  # per thread
    max_windows: int = 20_000
    queue_limit: int = 10_000  # per SSE client
    catch_up_timeout_s: float = 5.0
    health_timeout_s: float = 3.0
    ready_timeout_s: float = 2.0  # how long one /readyz waits for the processor
    ready_cache_s: float = 5.0  # a /readyz success is reused this long
    store_name: str | None = None  # the read store's folder; default <host>-<port>
    # Accept connections before the read model has loaded (/v1 answers 503 meanwhile),
    # as `run_gateway` does; off, the app starts serving only once loaded.
    serve_while_loading: bool = False


SETTINGS = web.AppKey("settings", Settings)
OPTIONS = web.AppKey("options", Options)
BUS = web.AppKey("bus", CommandBus)
READ_MODEL = web.AppKey("read_model", ReadModel)
FEED = web.AppKey("feed", StreamFeed)
OFFSETS = web.AppKey("offsets", Offsets)
LIMITER = web.AppKey("limiter", TenantLimiter)
# Built once from the settings (THREADLINE_SCHEMA_REGISTRY_URL), shared by every reader
# and writer of the app.
CODEC = web.AppKey("codec", Codec)
