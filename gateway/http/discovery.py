"""Where the APIs live: `GET /` lists them, and a request that a client library would
send to the bare root (an SDK pointed at the server, not at its API's prefix) gets a
404 that says where to point it, before authentication (the answer is no secret, and
a 401 would send the user looking at their key).

    GET /            the API index (public)
    GET /favicon.ico 204: browsers ask on every page load (public)
"""

from __future__ import annotations

from aiohttp import web

from gateway.http.problems import Handler, Problem

__all__ = ["APIS", "discovery_middleware", "favicon", "index", "wrong_prefix"]

# Each API's prefix and what speaks it (docs/clients.md).
APIS = {
    "native": {"prefix": "/v1", "docs": "/openapi.json"},
    "langgraph": {"prefix": "/langgraph", "clients": "langgraph-sdk (Python and JavaScript)"},
    "ai_sdk_chat": {"prefix": "/v1/ai/chat", "clients": "the AI SDK's useChat"},
    "console": {"prefix": "/console"},
}
# First path segments of the LangGraph API's routes, as an SDK pointed at the root sends them.
_LANGGRAPH_ROOTS = frozenset({"threads", "assistants", "runs", "store", "crons", "info"})


def wrong_prefix(path: str) -> str | None:
    """What to tell a client whose request belongs to an API under another prefix."""
    first = path.lstrip("/").split("/", 1)[0]
    if first in _LANGGRAPH_ROOTS:
        return (f"no route {path}: the LangGraph API is under /langgraph; point the "
                "SDK's url (apiUrl) at <this server>/langgraph")
    if path.rstrip("/") == "/api/chat":
        return ("no route /api/chat: the AI SDK chat is at /v1/ai/chat; give it to the "
                "chat transport as its api")
    return None


@web.middleware
async def discovery_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A 404 that says where the API lives, for a request no route matches."""
    error = getattr(request.match_info, "http_exception", None)
    if isinstance(error, web.HTTPNotFound):
        hint = wrong_prefix(request.path)
        if hint is not None:
            raise Problem(404, "wrong-prefix", hint, apis=APIS)
    return await handler(request)


async def index(request: web.Request) -> web.Response:
    """GET /: the APIs this gateway serves and where."""
    return web.json_response({"service": "threadline", "apis": APIS})


async def favicon(request: web.Request) -> web.Response:
    """GET /favicon.ico: nothing, without a 401 in the browser's console."""
    return web.Response(status=204)
