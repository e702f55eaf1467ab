"""API keys to tenants, and an access log that never writes a key.

`Authorization: Bearer <key>` everywhere, or `x-api-key: <key>` (what the LangGraph
SDKs send, `gateway.adapters.langgraph`). The SSE routes also accept
`?access_token=<key>` and the `threadline_token` cookie, because browsers'
EventSource cannot set headers. Keys map to tenants through `settings.gateway.api_keys`.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.typedefs import Middleware

from gateway.http.problems import Handler, Problem
from streams.observability import logs

__all__ = ["COOKIE", "TENANT", "RedactingAccessLogger", "auth_middleware", "redact"]

TENANT = web.RequestKey("tenant", str)
COOKIE = "threadline_token"
PUBLIC_PATHS = frozenset({"/livez", "/healthz", "/readyz", "/openapi.json", "/demo", "/metrics",
                          "/console", "/console/console.js", "/console/console.css"})
_SSE_PATH = re.compile(r"^/v1/(threads/[^/]+/stream|runs/[^/]+/events)$")
_SECRET_PARAMS = re.compile(r"((?:^|[?&])access_token=)[^&]*", re.IGNORECASE)


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


def auth_middleware(keys: Mapping[str, str]) -> Middleware:
    """Middleware that admits a request only with one of the API keys (Bearer, or token/cookie on SSE)."""
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS:
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
        tenant = _tenant_for(keys, presented)
        if tenant is None:
            raise _unauthorized("unknown API key")
        request[TENANT] = tenant
        logs.bind(tenant=tenant)  # JSON log lines of this request name the tenant
        return await handler(request)

    return middleware


class RedactingAccessLogger(AbstractAccessLogger):
    """One line a request; query strings pass through `redact`."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        """Write one access-log line with any access token in the URL redacted."""
        self.logger.info('%s "%s %s" %s %.1fms', request.remote, request.method,
                         redact(request.path_qs), response.status, time * 1000)

