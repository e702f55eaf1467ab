"""The gateway application: the app factory and `run_gateway`.

`create_app(settings)` wires the routes, the adapters as sub-apps (`add_subapp`), the
middlewares (problem+json, API keys, readiness, the per-tenant post rate), the shared
objects under `web.AppKey`s (`gateway.keys`), one
`cleanup_ctx` that starts the Kafka clients and background tasks (read model,
decisions consumer and command producer, stream feed) and stops them after, and an
`on_shutdown` hook that ends every open SSE stream so shutdown does not wait on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.adapters import ai_sdk, console, langgraph
from gateway.adapters.demo import demo_page
from gateway.api import branches, copies, interrupts, rest
from gateway.api.openapi import openapi
from gateway.cluster.hop import HopSigner
from gateway.cluster.owners import OwnerBoard, owners_topic
from gateway.cluster.reads import READS_PATH, RemoteReads, internal_reads
from gateway.cluster.remote import Forwarder
from gateway.cluster.route import route_middleware
from gateway.cluster.serve import internal_stream
from gateway.cluster.sticky import assignors
from gateway.http.auth import (
    BROWSER_TOKENS_PATH,
    INTERNAL_PREFIX,
    RedactingAccessLogger,
    auth_middleware,
)
from gateway.http.browser_tokens import BrowserTokens
from gateway.http.cors import add_cors_headers, cors_middleware
from gateway.http.discovery import discovery_middleware, favicon, index
from gateway.http.health import HEALTH, HealthProbe, healthz
from gateway.http.limits import TenantLimiter, post_rate_middleware
from gateway.http.observability import observe_app, observe_middleware
from gateway.http.plumbing import starting_middleware
from gateway.http.problems import problem_middleware
from gateway.http.ready import READY, Readiness, readyz
from gateway.kafka import Offsets
from gateway.keys import (
    BUS,
    CODEC,
    FEED,
    LIMITER,
    OFFSETS,
    OPTIONS,
    OWNERS,
    READ_MODEL,
    SETTINGS,
    Options,
)
from gateway.live import streaming
from gateway.live.feed import StreamFeed
from gateway.live.run_stream import STREAMS, RunStreams
from gateway.live.tokens import deployment_keys
from gateway.model.decisions import CommandBus
from gateway.model.read_model import ReadModel
from streams.aio import start_when_reachable
from streams.config import Settings
from streams.core.domain import (
    Event,
    RunAccepted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    ThreadCreated,
    ThreadDeleted,
)
from streams.heap import freeze_startup_heap
from streams.kafka.clients import aiokafka_config
from streams.kafka.topics import ensure_specs, ensure_topics
from streams.observability.tracing import setup_tracing
from streams.wire import Codec

__all__ = ["Options", "create_app", "max_body_bytes", "run_gateway"]

log = logging.getLogger("threadline.gateway")


# The widest legal JSON spelling of one character (a code point, as `len` and the
# input limit count them): an astral one as an escaped surrogate pair, "\ud83d\ude00",
# 12 bytes. Every other spelling is narrower: a BMP escape is 6 bytes for 1 character,
# raw UTF-8 at most 4. So 12 bytes a character admits the longest allowed input
# however a client escapes it, and the characters are counted after parsing.
MAX_BYTES_PER_CHAR = 12
JSON_OVERHEAD_BYTES = 16_384  # the other members, names and whitespace


def max_body_bytes(max_input_chars: int) -> int:
    """The request body limit: the longest input in its widest escaping, plus room."""
    return max_input_chars * MAX_BYTES_PER_CHAR + JSON_OVERHEAD_BYTES


def create_app(settings: Settings, options: Options | None = None) -> web.Application:
    """The gateway as an aiohttp application; Kafka clients start with the app."""
    max_body = max_body_bytes(settings.policy.max_input_chars)
    limiter = TenantLimiter(settings.gateway.limits)
    grouped = settings.gateway.advertised_url is not None  # the gateways share partitions
    hops = HopSigner(deployment_keys(settings)) if grouped else None
    options = options or Options()
    offsets = Offsets(settings)
    codec = Codec.from_settings(settings)
    # In a group each gateway reads and serves its share of the partitions only.
    read_model = ReadModel(settings, offsets, options.catch_up_timeout_s, options.store_name,
                           codec=codec, split=grouped)
    board = OwnerBoard(settings, settings.gateway.advertised_url) \
        if hops is not None and settings.gateway.advertised_url is not None else None
    # As long as a dead owner takes to leave the group, and a margin.
    forwarder = Forwarder(board, hops, settings.session_timeout_ms / 1000 + 10,
                          options.keepalive_s) if board is not None and hops is not None else None
    app = web.Application(client_max_size=max_body, middlewares=[
        cors_middleware(settings.gateway.cors_origins), observe_middleware, problem_middleware,
        discovery_middleware,
        auth_middleware(settings.gateway.api_keys, BrowserTokens.from_settings(settings),
                        [langgraph.internal_thread_id], _run_thread, hops),
        starting_middleware, post_rate_middleware(limiter),
        route_middleware(forwarder, read_model.here)])
    app[LIMITER] = limiter
    bus = CommandBus(settings, codec)
    feed = StreamFeed(settings, read_model, offsets, window_events=options.window_events,
                      max_windows=options.max_windows, queue_limit=options.queue_limit,
                      codec=codec)

    def changed(event: Event) -> None:  # reads of a thread that just changed catch up first
        read_model.note_write(event.thread_id)
        if isinstance(event, ThreadCreated):
            read_model.note_created(event.thread_id)
        if isinstance(event, RunAccepted):
            read_model.note_accepted(event.run_id, event.thread_id)
        if isinstance(event, RunCancelled):  # a rolled-back run's records are gone: no wait
            read_model.note_settled(event.run_id)
        if isinstance(event, RunCompleted | RunFailed | RunCancelled):
            read_model.note_ended(event.thread_id, event.run_id)
        if isinstance(event, ThreadDeleted):  # its open streams end now
            read_model.note_deleted(event.thread_id)
            feed.drop_thread(event.thread_id)

    def changed_undecoded(thread_id: str, kind: bytes) -> None:  # the same, by its headers
        read_model.note_write(thread_id)
        if kind == b"ThreadCreated":
            read_model.note_created(thread_id)
        elif kind == b"ThreadDeleted":
            read_model.note_deleted(thread_id)
            feed.drop_thread(thread_id)

    bus.on_event = changed
    bus.on_undecoded = changed_undecoded
    read_model.on_deleted = feed.drop_thread
    app[SETTINGS], app[OPTIONS], app[READ_MODEL], app[BUS] = settings, options, read_model, bus
    app[OFFSETS] = offsets
    app[CODEC] = codec
    app[FEED] = feed
    app[STREAMS] = RunStreams(settings, feed, read_model, limiter, codec, options.keepalive_s)
    if board is not None and forwarder is not None:
        app[OWNERS] = board
        feed.on_owned = board.claim
        feed.assignors = assignors(board.instance, board.partition_owners, board.map.warm)
        board.on_standbys = read_model.keep_warm  # standby copies: warm when they come here
        limiter.sharing = board.map.members  # each gateway takes its share of the post rate
        limiter.streams_elsewhere = board.streams_elsewhere  # a tenant's streams: the group's
        board.streams = lambda: limiter.streams
        board.runs = read_model.active_run_counts  # a tenant's active runs: the group's
        read_model.runs_elsewhere = board.runs_elsewhere
        read_model.elsewhere = RemoteReads(forwarder, codec, settings.partitions, read_model.here)
        app[STREAMS].remote = forwarder
        app.router.add_get(INTERNAL_PREFIX + "threads/{thread_id}/stream", internal_stream)
        app.router.add_get(READS_PATH, internal_reads)
    app[HEALTH] = HealthProbe(settings.bootstrap, aiokafka_config(settings))
    app[READY] = Readiness(settings, bus, app[HEALTH], read_model,
                           timeout_s=options.ready_timeout_s, cache_s=options.ready_cache_s)
    app.cleanup_ctx.append(_kafka)
    app.on_response_prepare.append(add_cors_headers)
    app.on_shutdown.append(_close_streams)
    app.router.add_get("/", index)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_get("/livez", livez)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/demo", demo_page)
    app.router.add_post(BROWSER_TOKENS_PATH, rest.issue_browser_token)
    app.router.add_post("/v1/threads", rest.create_thread)
    app.router.add_get("/v1/threads", rest.list_threads)
    app.router.add_get("/v1/threads/{thread_id}", rest.get_thread)
    app.router.add_delete("/v1/threads/{thread_id}", rest.delete_thread)
    app.router.add_get("/v1/threads/{thread_id}/messages", rest.list_messages)
    app.router.add_post("/v1/threads/{thread_id}/user_message", rest.post_user_message)
    app.router.add_post("/v1/threads/{thread_id}/messages/{message_id}/regenerate",
                        branches.regenerate)
    app.router.add_post("/v1/threads/{thread_id}/messages/{message_id}/edit",
                        branches.edit_message)
    app.router.add_get("/v1/threads/{thread_id}/branches", branches.list_branches)
    app.router.add_post("/v1/threads/{thread_id}/branches/current", branches.switch_branch)
    app.router.add_post("/v1/threads/{thread_id}/copy", copies.copy_thread)
    app.router.add_post("/v1/threads/{thread_id}/runs/{run_id}/cancel", rest.cancel_run)
    app.router.add_post("/v1/threads/{thread_id}/runs/{run_id}/resume", interrupts.resume_run)
    app.router.add_get("/v1/threads/{thread_id}/stream", streaming.thread_stream)
    app.router.add_get("/v1/runs/{run_id}/events", streaming.run_events)
    # The adapters, each a sub-app: the middlewares above apply to them by construction.
    app.add_subapp(ai_sdk.PREFIX, ai_sdk.create_app())  # the Vercel AI SDK's chat
    app.add_subapp(console.PAGE_PREFIX, console.page_app())  # the web console
    app.add_subapp(console.API_PREFIX, console.api_app())
    app.add_subapp(langgraph.PREFIX, langgraph.create_app())  # the LangGraph Platform runs API
    observe_app(app)  # GET /metrics, gauges (docs/operations.md)
    return app


async def _kafka(app: web.Application) -> AsyncIterator[None]:
    await asyncio.to_thread(ensure_topics, app[SETTINGS])
    board = app.get(OWNERS)
    if board is not None:
        await asyncio.to_thread(ensure_specs, app[SETTINGS], [owners_topic(app[SETTINGS])])
    await asyncio.to_thread(app[CODEC].register_schemas)  # blocking HTTP: off the loop
    started: list[Offsets | ReadModel | CommandBus | StreamFeed | OwnerBoard] = []
    feed_start: asyncio.Task[None] | None = None
    try:
        clients: list[Offsets | ReadModel | CommandBus | OwnerBoard] = [
            app[OFFSETS], app[READ_MODEL], app[BUS], *([board] if board else [])]
        for client in clients:
            # Each makes its aiokafka clients in start() and undoes a partial start in
            # stop(), so it can start again while a broker restarts.
            await start_when_reachable(type(client).__name__, client.start, client.stop,
                                       app[SETTINGS].topic_stall_s)
            started.append(client)
        # The feed's start waits for the read model to load, which grows with the data
        # on a cold start: serve meanwhile (/livez alive, /v1 503 until the feed runs).
        feed_start = asyncio.create_task(_start_feed(app, started), name="feed start")
        if not app[OPTIONS].serve_while_loading:
            await feed_start
        yield
    finally:
        if feed_start is not None and not feed_start.done():
            feed_start.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feed_start
        await app[HEALTH].close()
        forwarder = app[STREAMS].remote
        if forwarder is not None:
            await forwarder.close()
        for running in reversed(started):
            try:
                await running.stop()
            except Exception:
                log.exception("stopping %s", type(running).__name__)


async def _start_feed(app: web.Application, started: list[
        Offsets | ReadModel | CommandBus | StreamFeed | OwnerBoard]) -> None:
    try:
        await start_when_reachable("StreamFeed", app[FEED].start, app[FEED].stop,
                                   app[SETTINGS].topic_stall_s)
    except Exception:
        if not app[OPTIONS].serve_while_loading:
            raise  # the app's start fails, as any other client's would
        # Crash-only: a gateway serving without a feed must restart, not limp on.
        log.critical("the stream feed did not start; exiting", exc_info=True)
        logging.shutdown()
        os._exit(70)
    started.append(app[FEED])
    freeze_startup_heap()  # the read model loaded: what is left lives as long as the process


async def _run_thread(request: web.Request, tenant: str, run_id: str) -> str | None:
    run = await request.config_dict[READ_MODEL].run(tenant, run_id)
    return None if run is None else run.state.thread_id


async def livez(request: web.Request) -> web.Response:
    """GET /livez: the process serves (for a liveness probe: never fails on Kafka). It
    also names the partitions this gateway owns (all, outside a group), out of how
    many: an owner-aware load balancer polls it (deploy/haproxy/threadline.lua)."""
    feed = request.config_dict[FEED]
    return web.json_response({"status": "alive", "loaded": feed.started,
                              "partitions": request.config_dict[SETTINGS].partitions,
                              "owned": "all" if feed.owned is None else sorted(feed.owned)})


async def _close_streams(app: web.Application) -> None:
    app[FEED].close_all("shutdown")


def run_gateway(settings: Settings) -> int:
    """Serve on settings.gateway.http_host:settings.gateway.http_port until SIGINT or SIGTERM."""
    host, port = settings.gateway.http_host, settings.gateway.http_port

    def announce(*_: object, **__: object) -> None:
        print(f"threadline gateway listening on http://{host}:{port} "
              f"(Kafka {settings.bootstrap}, topics {settings.topic_prefix}*)", flush=True)

    logging.getLogger("aiohttp.access").setLevel(logging.INFO)
    setup_tracing(settings.observability, "gateway")
    if not settings.gateway.api_keys:
        log.warning("THREADLINE_API_KEYS is empty: every /v1 request will get 401")
    app = create_app(settings, Options.from_env(serve_while_loading=True))
    web.run_app(app, host=host, port=port, print=announce,
                access_log_class=RedactingAccessLogger, shutdown_timeout=10,
                handler_cancellation=True)  # a gone SSE client ends its handler at once
    return 0
