"""Typed keys of the objects the gateway app shares between handlers, and its tunables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web
from pydantic import Field

from gateway.cluster.owners import OwnerBoard
from gateway.http.limits import TenantLimiter
from gateway.kafka import Offsets
from gateway.live.feed import StreamFeed
from gateway.model.decisions import CommandBus
from gateway.model.read_model import ReadModel
from streams.config import Settings
from streams.env import Section
from streams.wire import Codec

__all__ = ["BUS", "CODEC", "FEED", "LIMITER", "OFFSETS", "OPTIONS", "OWNERS", "READ_MODEL", "SETTINGS",
           "Options", "OptionsEnv"]


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

    @classmethod
    def from_env(cls, overrides: Mapping[str, str] | None = None, *,
                 serve_while_loading: bool = False) -> Options:
        """The options from THREADLINE_GATEWAY_* variables (plus overrides), defaults where unset."""
        read = OptionsEnv.read({**os.environ, **(overrides or {})})
        return cls(keepalive_s=read.keepalive_s, retry_ms=read.retry_ms,
                   window_events=read.window_events, max_windows=read.max_windows,
                   queue_limit=read.queue_limit, catch_up_timeout_s=read.catch_up_timeout_s,
                   health_timeout_s=read.health_timeout_s, ready_timeout_s=read.ready_timeout_s,
                   ready_cache_s=read.ready_cache_s, store_name=read.store_name,
                   serve_while_loading=serve_while_loading)


_DEFAULT = Options()


class OptionsEnv(Section):
    """The variables of `Options`; its defaults are the dataclass's. `serve_while_loading`
    has none: `run_gateway` always serves while loading, the tests' apps may not."""

    keepalive_s: float = Field(_DEFAULT.keepalive_s, gt=0, alias="THREADLINE_GATEWAY_KEEPALIVE_S")
    retry_ms: int = Field(_DEFAULT.retry_ms, ge=0, alias="THREADLINE_GATEWAY_SSE_RETRY_MS")
    window_events: int = Field(_DEFAULT.window_events, gt=0, alias="THREADLINE_GATEWAY_WINDOW_EVENTS")
    max_windows: int = Field(_DEFAULT.max_windows, gt=0, alias="THREADLINE_GATEWAY_MAX_WINDOWS")
    queue_limit: int = Field(_DEFAULT.queue_limit, gt=0, alias="THREADLINE_GATEWAY_QUEUE_LIMIT")
    catch_up_timeout_s: float = Field(_DEFAULT.catch_up_timeout_s, gt=0,
                                      alias="THREADLINE_GATEWAY_CATCH_UP_TIMEOUT_S")
    health_timeout_s: float = Field(_DEFAULT.health_timeout_s, gt=0,
                                    alias="THREADLINE_GATEWAY_HEALTH_TIMEOUT_S")
    ready_timeout_s: float = Field(_DEFAULT.ready_timeout_s, gt=0,
                                   alias="THREADLINE_GATEWAY_READY_TIMEOUT_S")
    ready_cache_s: float = Field(_DEFAULT.ready_cache_s, ge=0, alias="THREADLINE_GATEWAY_READY_CACHE_S")
    store_name: str | None = Field(_DEFAULT.store_name, alias="THREADLINE_GATEWAY_STORE_NAME")


SETTINGS = web.AppKey("settings", Settings)
OPTIONS = web.AppKey("options", Options)
BUS = web.AppKey("bus", CommandBus)
READ_MODEL = web.AppKey("read_model", ReadModel)
FEED = web.AppKey("feed", StreamFeed)
OFFSETS = web.AppKey("offsets", Offsets)
OWNERS = web.AppKey("owners", OwnerBoard)  # with a gateway group (THREADLINE_GATEWAY_URL)
LIMITER = web.AppKey("limiter", TenantLimiter)
# Built once from the settings (THREADLINE_SCHEMA_REGISTRY_URL), shared by every reader
# and writer of the app.
CODEC = web.AppKey("codec", Codec)
