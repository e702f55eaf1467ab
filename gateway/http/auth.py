"""API keys to tenants, and an access log that never writes a key.

`Authorization: Bearer <key>` everywhere, or `x-api-key: <key>` (what the LangGraph
SDKs send, `gateway.adapters.langgraph`). The SSE routes also accept
`?access_token=<key>` and the `threadline_token` cookie, because browsers'
EventSource cannot set headers. Keys map to tenants through `settings.gateway.api_keys`.
A browser token (`gateway.http.browser_tokens`) is accepted wherever a key is, within
its tenant and, if it has one, its thread.
"""

from __future__ import annotations

import hmac
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.typedefs import Middleware

from gateway.cluster.hop import HOP_HEADER, BadHop, HopSigner, hop_target
from gateway.http.browser_tokens import PREFIX as BROWSER_PREFIX
from gateway.http.browser_tokens import BadBrowserToken, BrowserGrant, BrowserTokens
from gateway.http.problems import Handler, Problem
from streams.observability import logs

__all__ = ["BROWSER_TOKENS_PATH", "COOKIE", "GRANT", "HOPPED", "PUBLIC_PATHS", "PUBLIC_PREFIXES",
           "TENANT",
           "RedactingAccessLogger", "RunThread", "ThreadIds", "auth_middleware", "is_public",
           "redact"]

TENANT = web.RequestKey("tenant", str)
HOPPED = web.RequestKey("hopped", bool)  # sent on by another gateway (gateway.cluster.route)
GRANT = web.RequestKey("browser_grant", BrowserGrant)  # set when a browser token was presented
BROWSER_TOKENS_PATH = "/v1/browser_tokens"
COOKIE = "threadline_token"
PUBLIC_PATHS = frozenset({"/", "/favicon.ico", "/livez", "/healthz", "/readyz", "/openapi.json",
                          "/demo", "/metrics", "/console"})
# The console's files (its script, styles and vendored libraries) hold no data: the
# key stays in the browser. Its API is under /v1/console and needs the key.
PUBLIC_PREFIXES = ("/console/",)
INTERNAL_PREFIX = "/internal/v1/"  # hops between gateways (gateway.cluster)
_SSE_PATH = re.compile(r"^/v1/(threads/[^/]+/stream|runs/[^/]+/events)$")
_SECRET_PARAMS = re.compile(r"((?:^|[?&])access_token=)[^&]*", re.IGNORECASE)


def is_public(path: str) -> bool:
    """Whether `path` is served without a key (`PUBLIC_PATHS`, `PUBLIC_PREFIXES`)."""
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def redact(path_qs: str) -> str:
    """`path_qs` with the value of any `access_token` parameter replaced."""
    return _SECRET_PARAMS.sub(r"\1[redacted]", path_qs)


def _tenant_for(keys: Mapping[str, str], presented: str) -> str | None:
    # aiohttp decodes header bytes as UTF-8 with surrogateescape: a key that is not
    # printable ASCII (as every issued key is) cannot match, and must not reach .encode().
    if not (presented.isascii() and presented.isprintable()):
        return None
    found = None
    for key, tenant in keys.items():  # compare against every key: no timing hint
        if hmac.compare_digest(key.encode(), presented.encode()):
            found = tenant
    return found


def _unauthorized(detail: str) -> Problem:
    return Problem(401, "unauthorized", detail,
                   headers={"WWW-Authenticate": 'Bearer realm="threadline"'})


# Another way a route may name a thread (an adapter's own ids): the tenant and the id
# in its path -> the thread's id, for a browser token's thread scope.
ThreadIds = Callable[[str, str], str]
# The thread of a tenant's run (None if unknown): the app reads it from its read model.
RunThread = Callable[[web.Request, str, str], Awaitable[str | None]]


def auth_middleware(keys: Mapping[str, str], browser: BrowserTokens | None = None,
                    thread_ids: Sequence[ThreadIds] = (),
                    run_thread: RunThread | None = None,
                    hops: HopSigner | None = None) -> Middleware:
    """Middleware that admits a request only with one of the API keys, or a browser token
    (`gateway.http.browser_tokens`) within its scope: as a Bearer, an `x-api-key`, or
    on SSE a token parameter or cookie. Another gateway's hop (`/internal/`, with
    `hops`) is admitted by its signed `Threadline-Hop` header alone: the gateway the
    client reached checked the client's key (`gateway.cluster.hop`)."""
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_public(request.path):
            return await handler(request)
        hop = request.headers.get(HOP_HEADER)
        if request.path.startswith(INTERNAL_PREFIX) or (hop is not None and hops is not None):
            if hops is None or hop is None:
                raise _unauthorized("a gateway hop is required")
            target = request.raw_path
            if not request.path.startswith(INTERNAL_PREFIX):  # a request sent on whole
                target = hop_target(target, await request.read() if request.body_exists
                                    else b"")
                request[HOPPED] = True
            try:
                tenant = hops.verify(hop, request.method, target, time.time())
            except BadHop as exc:
                raise _unauthorized(str(exc)) from None
            request[TENANT] = tenant
            logs.bind(tenant=tenant)
            return await handler(request)
        presented: str | None = None
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, value = header.partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                raise _unauthorized("Authorization must be 'Bearer <api key>'")
            presented = value.strip()
        elif request.headers.get("x-api-key"):
            presented = request.headers["x-api-key"].strip()
        elif _SSE_PATH.match(request.path):
            presented = request.query.get("access_token") or request.cookies.get(COOKIE)
        if not presented:
            raise _unauthorized("an API key is required")
        if browser is not None and presented.startswith(BROWSER_PREFIX):
            try:
                grant = browser.verify(presented, time.time())
            except BadBrowserToken as exc:
                raise _unauthorized(str(exc)) from None
            await _within(request, grant, thread_ids, run_thread)
            tenant = grant.tenant
            request[GRANT] = grant
        else:
            found = _tenant_for(keys, presented)
            if found is None:
                raise _unauthorized("unknown API key")
            tenant = found
        request[TENANT] = tenant
        logs.bind(tenant=tenant)  # JSON log lines of this request name the tenant
        return await handler(request)

    return middleware


async def _within(request: web.Request, grant: BrowserGrant, thread_ids: Sequence[ThreadIds],
                  run_thread: RunThread | None) -> None:
    """Refuse (403) what a browser token does not grant: issuing tokens, and with a
    thread scope, any route not about that thread (a route naming a thread, or a run's
    events whose run is on it)."""
    if request.path == BROWSER_TOKENS_PATH:
        raise Problem(403, "forbidden", "a browser token cannot issue browser tokens")
    scope = grant.thread_id
    if scope is None:
        return
    named = request.match_info.get("thread_id")
    if named is not None and (named == scope or any(ids(grant.tenant, named) == scope
                                                    for ids in thread_ids)):
        return
    if named is None and (run_id := request.match_info.get("run_id")) is not None \
            and run_thread is not None and await run_thread(request, grant.tenant, run_id) == scope:
        return
    raise Problem(403, "forbidden", f"this browser token is for thread {scope} only")


_PROBES = frozenset({"/livez", "/readyz", "/healthz"})


class RedactingAccessLogger(AbstractAccessLogger):
    """One line a request; query strings pass through `redact`. A probe that passes is
    not logged: a load balancer checks every half second, which buried the lines
    that matter (a failing probe still is)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        """Write one access-log line with any access token in the URL redacted."""
        if response.status < 400 and request.path in _PROBES:
            return
        self.logger.info('%s "%s %s" %s %.1fms', request.remote, request.method,
                         redact(request.path_qs), response.status, time * 1000)

