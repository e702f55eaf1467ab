"""`GET /console`: the web console, a page a person uses to look at threads and runs.

Plain HTML, CSS and JavaScript from `gateway/adapters/console/static/`, nothing from another
host. The page asks for an API key once and keeps it in `sessionStorage`; it calls
the same `/v1` API as any client (`Authorization: Bearer`, and `?access_token=` for
`EventSource`, which cannot set headers). Its one endpoint of its own,
`GET /v1/console/threads/{thread_id}/run`, shows the active run's liveness
(heartbeats), which no SSE event carries.

Two sub-apps, as the paths have two roots: `page_app()` at `PAGE_PREFIX` (public: the
page holds no data, the key stays in the browser) and `api_app()` at `API_PREFIX`;
the gateway's middlewares apply to both.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from gateway.http.auth import TENANT
from gateway.http.problems import Problem
from gateway.keys import READ_MODEL

__all__ = ["API_PREFIX", "CONSOLE_PATHS", "PAGE_PREFIX", "api_app", "console_file", "page_app",
           "run_liveness"]

PAGE_PREFIX = "/console"
API_PREFIX = "/v1/console"

STATIC = Path(__file__).parent / "static"
_FILES = {
    "/console": ("index.html", "text/html"),
    "/console/console.js": ("console.js", "text/javascript"),
    "/console/console.css": ("console.css", "text/css"),
}
CONSOLE_PATHS = frozenset(_FILES)  # public: the page holds no data, the key stays in the browser
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                       "frame-ancestors 'none'"}


async def console_file(request: web.Request) -> web.Response:
    """One of the console's three files."""
    name, content_type = _FILES[request.path]
    return web.Response(body=(STATIC / name).read_bytes(), content_type=content_type,
                        charset="utf-8", headers=_HEADERS)


async def run_liveness(request: web.Request) -> web.Response:
    """GET /v1/console/threads/{thread_id}/run: the active run's attempt, status and
    liveness times (`last_heartbeat_ms`), and the last run's outcome."""
    state = await request.config_dict[READ_MODEL].thread(request[TENANT],
                                                 request.match_info["thread_id"])
    if state is None:
        raise Problem(404, "not-found", "no such thread")
    run, last = state.active_run, state.last_run
    return web.json_response({
        "thread_id": state.thread_id,
        "active_run": None if run is None else {
            "run_id": run.run_id, "attempt": run.attempt, "status": run.status.value,
            "attempt_started_ms": run.attempt_started_ms,
            "last_heartbeat_ms": run.last_heartbeat_ms, "retry_due_ms": run.retry_due_ms},
        "last_run": None if last is None else {
            "run_id": last.run_id, "status": last.status.value, "attempts": last.attempts},
    }, headers={"Cache-Control": "no-store"})


def page_app() -> web.Application:
    """The page and its files, relative to PAGE_PREFIX."""
    app = web.Application()
    for path in _FILES:
        app.router.add_get(path.removeprefix(PAGE_PREFIX), console_file)
    return app


def api_app() -> web.Application:
    """The console's endpoint, relative to API_PREFIX."""
    app = web.Application()
    app.router.add_get("/threads/{thread_id}/run", run_liveness)
    return app
