"""CORS: browser apps served from their own origin may call the gateway, when that
origin is allowed (`THREADLINE_CORS_ORIGINS`; none by default).

The outermost middleware, so that every answer a browser app may read carries the
headers, problems included (a 409 or a 401 the app must show):

- a preflight (`OPTIONS` with `Access-Control-Request-Method`) from an allowed origin is
  answered here, 204, before authentication (a browser sends no credentials with it),
  for any route of the native API, the LangGraph API and the AI SDK chat; from another
  origin, or asking for a method or header the gateway does not take, it is a 403
  problem;
- any other request from an allowed origin gets `Access-Control-Allow-Origin` (that
  origin, never `*` unless configured), `Vary: Origin`, and the response headers a
  client reads exposed (`Location`, `Content-Location`, `Retry-After`);
- a request from an origin that is not allowed is served without those headers, so the
  browser withholds the answer from the page. Same-origin requests (the console) are
  not CORS and are unaffected.

Credentials mode is not used: a browser app sends a key or a browser token in the
`Authorization` header (docs/clients.md), not a cookie.

Why not aiohttp-cors: it attaches per route, and the gateway mounts its adapters as
sub-apps whose routes it would have to enumerate; a middleware covers every route,
present and future, and stays small.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from gateway.http.problems import Handler, Problem, problem_response

__all__ = ["ALLOWED_HEADERS", "ALLOWED_METHODS", "add_cors_headers", "cors_middleware"]

ALLOWED_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
# Request headers a client of the gateway's APIs sends (lower case): the keys, JSON
# bodies, idempotency, SSE resume, and what the SDKs add.
ALLOWED_HEADERS = frozenset({"authorization", "x-api-key", "content-type", "idempotency-key",
                             "last-event-id", "accept", "cache-control", "x-request-id",
                             "traceparent", "tracestate"})
EXPOSED = "Location, Content-Location, Retry-After, Content-Type"
MAX_AGE_S = 600
# The CORS headers an allowed cross-origin request's answer gets.
_CORS: web.RequestKey[dict[str, str]] = web.RequestKey("cors_headers", dict)


def cors_middleware(origins: Iterable[str]) -> Middleware:
    """The middleware for these allowed origins (`*`: any)."""
    allowed = frozenset(o.lower() for o in origins)
    any_origin = "*" in allowed

    def permitted(origin: str | None) -> bool:
        return origin is not None and (any_origin or origin.lower() in allowed)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get(hdrs.ORIGIN)
        if request.method == "OPTIONS" and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers:
            return _preflight(request, origin, permitted(origin))
        if permitted(origin):
            assert origin is not None
            # Added as the answer is prepared (`add_cors_headers`): a streamed (SSE)
            # answer sends its headers from inside its handler.
            headers: dict[str, str] = {
                hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: "*" if any_origin else origin,
                hdrs.ACCESS_CONTROL_EXPOSE_HEADERS: EXPOSED}
            request[_CORS] = headers
        return await handler(request)

    return middleware


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: the CORS headers of an allowed cross-origin request."""
    headers = request.get(_CORS)
    if headers:
        response.headers.update(headers)
        response.headers.add(hdrs.VARY, "Origin")


def _preflight(request: web.Request, origin: str | None, permitted: bool) -> web.Response:
    method = request.headers[hdrs.ACCESS_CONTROL_REQUEST_METHOD].upper()
    asked = [h.strip().lower() for h in
             request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "").split(",") if h.strip()]
    if not permitted:
        return problem_response(Problem(403, "origin-not-allowed",
                                        f"origin {origin or '(none)'} may not call this gateway "
                                        "from a browser (THREADLINE_CORS_ORIGINS)"), request.path)
    refused = [h for h in asked if h not in ALLOWED_HEADERS]
    if method not in ALLOWED_METHODS or refused:
        what = f"method {method}" if method not in ALLOWED_METHODS else \
            f"header {', '.join(refused)}"
        return problem_response(Problem(403, "cors-refused", f"{what} is not allowed"),
                                request.path)
    assert origin is not None
    return web.Response(status=204, headers={
        hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: origin,
        hdrs.ACCESS_CONTROL_ALLOW_METHODS: ", ".join(sorted(ALLOWED_METHODS)),
        hdrs.ACCESS_CONTROL_ALLOW_HEADERS: ", ".join(sorted(ALLOWED_HEADERS)),
        hdrs.ACCESS_CONTROL_MAX_AGE: str(MAX_AGE_S),
        hdrs.VARY: "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"})
